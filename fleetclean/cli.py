"""Command line: options -> calls. The one place that maps errors to exit statuses.

``main(argv, env) -> int`` never calls ``sys.exit`` itself and prints only through the
``Env`` it is given, so tests can swap the streams. The subcommands' handlers live in
``fleetclean.commands``, one module per job, imported only when their command runs; for
the same reason rich, the transport (paramiko) and the simulator's parser are imported only
by the commands that use them (``benchmarks/startup.py`` measures it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

from fleetclean.commands.env import Env, error_line
from fleetclean.commands.parser import build_parser
from fleetclean.errors import BadInput, ExitStatus, FleetcleanError

__all__ = ["Env", "build_parser", "main"]

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
    except Exception as exc:  # a bug: one line (or the traceback with --debug), exit 3
        if debug:
            import traceback  # only a bug needs it (linecache, tokenize: 2 ms of start-up)

            traceback.print_exception(type(exc), exc, exc.__traceback__, file=env.stderr)
            env.stderr.flush()
        else:
            error_line(env, internalerror_line(exc))
        return int(ExitStatus.INTERNAL)


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
