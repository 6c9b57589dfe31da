"""Command line: options -> calls. The one place that maps errors to exit statuses.

``main(argv, env) -> int`` never calls ``sys.exit`` itself and prints only through the
``Env`` it is given, so tests can swap the streams. The subcommands' handlers live in
``fleetclean.commands``, one module per job, imported only when their command runs; for
the same reason rich, the transport (paramiko) and the simulator's parser are imported only
by the commands that use them (``benchmarks/startup.py`` measures it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, cast

from fleetclean.commands.env import Env, error_line
from fleetclean.commands.parser import build_parser
from fleetclean.errors import WRITE_FAILED, BadInput, ExitStatus, FleetcleanError

__all__ = ["Env", "build_parser", "entry", "main"]

Handler = Callable[[argparse.Namespace, Env, list[str]], int]

# command -> (module, function): a handler's imports cost only the command that needs them.
_HANDLERS: dict[str, tuple[str, str]] = {
    "run": ("fleetclean.commands.run", "cmd_run"),
    "status": ("fleetclean.commands.status", "cmd_status"),
    "show": ("fleetclean.commands.info", "cmd_show"),
    "playbooks": ("fleetclean.commands.info", "cmd_playbooks"),
    "inventory": ("fleetclean.commands.info", "cmd_inventory"),
    "history": ("fleetclean.commands.history", "cmd_history"),
    "export": ("fleetclean.commands.export", "cmd_export"),
    "report": ("fleetclean.commands.report", "cmd_report"),
    "completion": ("fleetclean.commands.completion", "cmd_completion"),
    "__complete": ("fleetclean.commands.completion", "cmd_complete_names"),
    "demo": ("fleetclean.commands.info", "cmd_demo"),
    "sim": ("fleetclean.commands.info", "cmd_sim"),
}


def _handler(command: str) -> Handler:
    module, name = _HANDLERS[command]
    return cast(Handler, getattr(importlib.import_module(module), name))


def main(argv: Sequence[str] | None = None, env: Env | None = None) -> int:
    env = env or Env(own_process=argv is None)
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = env.debug
    try:
        args = build_parser(with_sim=_wants_sim(args_list)).parse_args(args_list)
        debug = debug or args.debug
        env = dataclasses.replace(env, no_color=env.no_color or args.no_color)
        if not args.command:
            build_parser(with_sim=False).print_help(env.stdout)
            return int(ExitStatus.OK)
        return _handler(args.command)(args, env, args_list)
    except BadInput as exc:
        error_line(env, f"fleetclean: error: {exc}")
        return int(ExitStatus.BAD_INPUT)
    except FleetcleanError as exc:
        error_line(env, f"fleetclean: error: {exc}")
        return int(ExitStatus.FAILED)
    except KeyboardInterrupt:
        error_line(env, "fleetclean: interrupted")
        return int(ExitStatus.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitStatus.OK)
    except OSError as exc:
        return _os_error(exc, env, debug)
    except Exception as exc:  # a bug: one line (or the traceback with --debug), exit 3
        return _bug(exc, env, debug)


def _os_error(exc: OSError, env: Env, debug: bool) -> int:
    """A full disk or quota under `> file` (export, show, history): a failure, not a bug.
    Any other OSError that reached here is a bug."""
    if exc.errno not in WRITE_FAILED:
        return _bug(exc, env, debug)
    error_line(env, f"fleetclean: error: could not write: {exc.strerror}")
    return int(ExitStatus.FAILED)


def _bug(exc: BaseException, env: Env, debug: bool) -> int:
    """A bug: one line (or the traceback with --debug), exit 3."""
    if debug:
        import traceback  # only a bug needs it (linecache, tokenize: 2 ms of start-up)

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=env.stderr)
        env.stderr.flush()
    else:
        error_line(env, internalerror_line(exc))
    return int(ExitStatus.INTERNAL)


def entry() -> NoReturn:
    """The ``fleetclean`` command itself (the console script, ``python -m fleetclean``):
    ``main``, then the process's end."""
    # The collector's default (a young collection every 700 new objects, an older one
    # every 10 of those) ran ~140 times in a 256-host status, 30-48 ms of its CPU, mostly
    # walking the 30,000 objects the imports left; every 10,000 it runs ~9 times, 16 ms.
    # Nothing fleetclean keeps grows with that: a host's objects are freed by reference
    # counting once it ends, and the few cycles (a closed connection's) wait a little
    # longer. Only for the command itself: a library caller keeps its own settings.
    gc.set_threshold(10_000, 20, 20)
    end(main())


def end(status: int) -> NoReturn:
    """Exit with ``status`` once ``main`` returned, without the interpreter's teardown.

    Python's own exit runs a full garbage collection and then frees every module and
    object one at a time: 25 ms of a two-host status's 250 (``benchmarks/startup.py``),
    paid after the last host answered. None of it is needed once ``main`` returned with
    this thread alone: every file fleetclean writes was closed by then, every connection
    and its threads ended, and no atexit hook of ours exists. Only the standard streams
    may still hold text; they are flushed here. Any other thread still alive (a second
    Ctrl-C left hosts running) is left to Python's exit as before, which waits on it.
    """
    # threading never imported (--version, --help, a completion): no other thread exists,
    # and importing it here to ask would cost each of those starts 0.5 ms.
    threading = sys.modules.get("threading")
    if threading is None or threading.active_count() == 1:
        try:
            if sys.stdout is not None:  # None: started with its stdout closed
                sys.stdout.flush()
        except BrokenPipeError:  # its reader is gone: as main's own BrokenPipeError
            pass
        except (OSError, ValueError) as exc:  # a full disk: the output is not all there
            if sys.stderr is not None:
                with contextlib.suppress(OSError, ValueError):
                    why = getattr(exc, "strerror", None) or exc
                    print("fleetclean: error: the result could not be written to standard "
                          f"output: {why}", file=sys.stderr)
            status = int(ExitStatus.FAILED)
        if sys.stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _wants_sim(argv: list[str]) -> bool:
    """Whether the command word is ``sim`` (the only one that needs its subcommands).

    >>> _wants_sim(["--debug", "sim", "up"]), _wants_sim(["status", "-i", "sim"])
    (True, False)
    """
    command = next((a for a in argv if not a.startswith("-")), "")
    return command == "sim"


def internalerror_line(exc: BaseException) -> str:
    """One line naming a bug: its type, message and where it was raised.

    >>> try:
    ...     {}["grace"]
    ... except KeyError as exc:
    ...     print(internalerror_line(exc))
    fleetclean: internal error (a bug): KeyError: 'grace' at <doctest ...>:2; rerun with --debug for the traceback
    """  # noqa: E501
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        here = last.filename
        package = os.path.dirname(os.path.abspath(__file__))
        if here.startswith(package + os.sep):
            here = "fleetclean/" + os.path.relpath(here, package)
        where = f" at {here}:{last.lineno}"
        if last.name != "<module>":
            where += f" in {last.name}"
    return (f"fleetclean: internal error (a bug): {type(exc).__name__}: {exc}{where}; "
            "rerun with --debug for the traceback")
