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
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

from fleetclean import __version__
from fleetclean.errors import BadInput, FleetcleanError, UsageError
from fleetclean.models import ExitStatus, Host
from fleetclean.slurm import options as slurm_options

if TYPE_CHECKING:
    from rich.console import Console

    from fleetclean import fleet
    from fleetclean.transport import Options

EXIT_STATUS_HELP = """\
exit status: 0 every host clean, 1 some host dirty or faulty, 2 some host unreachable or
failed, 3 internal error (a bug: --debug shows its traceback), 4 bad input (nothing was
sent), 130 interrupted.
"""

EPILOG_RUN = """\
examples:
  fleetclean run post-extraction -i lab.yml -l extraction
  fleetclean run post-extraction -i lab.yml -e model_file=/opt/sglang/srt/models/deepseek_v2.py
  fleetclean run pre-restart -i lab.yml -l 'gpu0*:!gpu05' --check
  fleetclean run ./my-teardown.yaml -i hosts.ini -e @vars.yaml --json > result.json
  fleetclean run post-extraction -i lab.yml --prom /var/lib/node_exporter/fleetclean.prom

""" + EXIT_STATUS_HELP

EPILOG_MAIN = """\
examples:
  fleetclean demo                                   a simulated fleet, cleaned end to end
  fleetclean status -i lab.yml                      per-host, per-GPU memory table
  fleetclean run post-extraction -i lab.yml --check what would be signalled, restored, removed
  fleetclean run post-extraction -i lab.yml         stop servers, free GPUs, verify
  fleetclean show post-extraction -i lab.yml --host gpu01   the exact bash sent to gpu01
  eval "$(fleetclean completion bash)"              tab completion in this shell

""" + EXIT_STATUS_HELP

# Wide enough for any table; rich lays a table out at its natural width, never wider.
_UNWRAPPED = 100_000


@dataclass
class Env:
    """The streams and environment one invocation uses; tests pass their own."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    no_color: bool = False

    def console(self, *, stderr: bool = False) -> Console:
        from rich.console import Console

        stream = self.stderr if stderr else self.stdout
        # https://no-color.org: set and not empty.
        no_color = self.no_color or bool(self.environ.get("NO_COLOR"))
        if _isatty(stream):
            return Console(file=stream, no_color=no_color, highlight=False, soft_wrap=False)
        # Logs and pipes (CI, `| tee`): nothing is hard-wrapped; a table is as wide as it
        # needs unless COLUMNS says otherwise, and lines of text are never broken.
        return Console(file=stream, no_color=no_color, highlight=False, soft_wrap=True,
                       width=_columns(self.environ))

    @property
    def debug(self) -> bool:
        return self.environ.get("FLEETCLEAN_DEBUG", "") not in ("", "0")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream is no terminal
        return False


def _columns(environ: dict[str, str]) -> int:
    value = environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else _UNWRAPPED


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad options; the contract says 4 and one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", hint=f"see '{self.prog} --help'")


def _global_opts(p: argparse.ArgumentParser, *, top: bool) -> None:
    # On every subcommand too (`fleetclean run ... --debug`); SUPPRESS there so that a
    # subcommand's default never overwrites the flag given before it.
    default: Any = False if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=default,
                   help="print the traceback of an internal error (or FLEETCLEAN_DEBUG=1)")
    p.add_argument("--no-color", action="store_true", default=default,
                   help="no colours (also when NO_COLOR is set)")


def hosts_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-i", "--inventory", action="append", metavar="SOURCE",
                    help="Ansible inventory (YAML or INI), or hosts inline: 'gpu01,gpu02,' "
                    "or 'gpu[01:16].lab,'; repeatable, later sources win; default "
                    "$FLEETCLEAN_INVENTORY")
    sp.add_argument("-c", "--connection", choices=("ssh", "local"),
                    help="reach every selected host this way (local: run here, no SSH)")
    sp.add_argument("--local", action="store_true",
                    help="this machine alone, named after its hostname, without SSH or -i")
    sp.add_argument("-l", "--limit", metavar="PATTERN",
                    help="select hosts: names, groups, globs, 'a:b', '&grp', '!grp', @file")
    sp.add_argument("-F", "--ssh-config", metavar="FILE",
                    help="ssh_config to honour (default ~/.ssh/config, or "
                    "$FLEETCLEAN_SSH_CONFIG)")


def conn_opts(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-f", "--forks", type=int, default=64, metavar="N",
                    help="hosts at once (default 64)")
    sp.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                    help="seconds to connect and authenticate (default 10)")
    sp.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds for the whole script on one host (default 300)")
    sp.add_argument("--known-hosts", action="append", default=[], metavar="FILE",
                    help="extra known_hosts file (default ~/.ssh/known_hosts)")
    sp.add_argument("--accept-new-host-keys", action="store_true",
                    help="record unknown host keys (never changed ones), like "
                    "StrictHostKeyChecking=accept-new")
    out = sp.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--csv", action="store_true", help="print one CSV row per host and GPU")
    sp.add_argument("--all", action="store_true",
                    help="list every host in the table; by default, past a screenful of "
                    "hosts, one line per status leads and only hosts not clean are listed")
    sp.add_argument("--prom", metavar="FILE",
                    help="also write the results in Prometheus text format (atomically), "
                    "e.g. for node_exporter's textfile collector")


def _add_run(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    run = sub.add_parser("run", help="run a teardown playbook on the selected hosts",
                         description="Render PLAYBOOK into one bash script per host, run them in "
                         "parallel over SSH, verify every GPU is free.",
                         epilog=EPILOG_RUN, formatter_class=fmt)
    run.add_argument("playbook", metavar="PLAYBOOK", help="built-in name or a YAML file")
    hosts_opts(run)
    run.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                     help="set a variable; @file.yaml reads a file; repeatable")
    run.add_argument("--check", action="store_true",
                     help="list what each stage would signal, restore or remove; change nothing")
    run.add_argument("--force", action="store_true", help="override guard stages")
    run.add_argument("--no-record", action="store_true", help="do not write a run record")
    slurm_options.add_options(run)
    conn_opts(run)


def _add_status(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    status = sub.add_parser("status", help="read-only GPU memory table of the selected hosts",
                            epilog="examples:\n  fleetclean status -i lab.yml\n"
                            "  fleetclean status -i lab.yml -l training --watch 2\n\n"
                            + EXIT_STATUS_HELP, formatter_class=fmt)
    hosts_opts(status)
    status.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable of the status playbook (e.g. max_used_mib=512)")
    status.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="S",
                        help="refresh the table in place every S seconds (default 2)")
    slurm_options.add_options(status)
    conn_opts(status)


def _add_show(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    show = sub.add_parser("show", help="print the exact script a host would receive",
                          epilog="examples:\n  fleetclean show post-extraction\n"
                          "  fleetclean show post-extraction -i lab.yml --host gpu01 -e grace=30\n",
                          formatter_class=fmt)
    show.add_argument("playbook", metavar="PLAYBOOK")
    hosts_opts(show)
    show.add_argument("--host", metavar="HOST", help="render with this host's variables")
    show.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--check", action="store_true", help="render the --check variant")


def _add_others(sub: Any, fmt: type[argparse.HelpFormatter], *, with_sim: bool) -> None:
    sub.add_parser("playbooks", help="list built-in playbooks")

    inv = sub.add_parser("inventory", help="show selected hosts with effective settings",
                         epilog="examples:\n  fleetclean inventory -i lab.yml -l training --json\n",
                         formatter_class=fmt)
    hosts_opts(inv)
    inv.add_argument("--json", action="store_true")

    hist = sub.add_parser("history", help="list run records, or show one",
                          epilog="examples:\n  fleetclean history\n  fleetclean history -1\n",
                          formatter_class=fmt)
    hist.add_argument("record", nargs="?", metavar="ID", help="record id prefix, path, or -1")
    hist.add_argument("--json", action="store_true")

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                          epilog='install:\n  eval "$(fleetclean completion bash)"   '
                          "# in ~/.bashrc\n  eval \"$(fleetclean completion zsh)\"    "
                          "# in ~/.zshrc\n", formatter_class=fmt)
    comp.add_argument("shell", choices=("bash", "zsh"))
    # No help: the completion script's own helper, kept out of --help.
    names = sub.add_parser("__complete")
    names.add_argument("what", choices=("hosts", "playbooks"))
    hosts_opts(names)

    demo = sub.add_parser("demo", help="clean a local simulated fleet end to end (Linux, root)")
    demo.add_argument("--nodes", type=int, default=4, metavar="N")
    demo.add_argument("--state-dir", metavar="DIR", help="where the simulated fleet lives")

    sim = sub.add_parser("sim", help="drive the simulated fleet by hand (Linux, root)")
    if with_sim:
        from fleetclean.sim import cli as sim_cli

        sim_cli.add_subparsers(sim)


def build_parser(*, with_sim: bool = True) -> argparse.ArgumentParser:
    """The whole command line; ``with_sim=False`` leaves out the simulator's subcommands,
    whose parser imports the simulator (yaml, its node code): ~10 ms of every start-up."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="fleetclean",
        description="Clean a fleet of GPU nodes over SSH: stop inference servers and their "
        "stray workers, free every GPU, put patched files back, and show a per-host, "
        "per-GPU memory table that proves it.",
        epilog=EPILOG_MAIN,
        formatter_class=fmt,
    )
    p.add_argument("--version", action="version", version=f"fleetclean {__version__}")
    _global_opts(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_add_run, _add_status, _add_show):
        add(sub, fmt)
    _add_others(sub, fmt, with_sim=with_sim)
    for sp in sub.choices.values():
        _global_opts(sp, top=False)
    return p


Handler = Callable[[argparse.Namespace, Env, list[str]], int]

# command -> (module, function): a handler's imports cost only the command that needs them.
_HANDLERS: dict[str, tuple[str, str]] = {
    "run": ("fleetclean.commands.run", "cmd_run"),
    "status": ("fleetclean.commands.status", "cmd_status"),
    "show": ("fleetclean.commands.info", "cmd_show"),
    "playbooks": ("fleetclean.commands.info", "cmd_playbooks"),
    "inventory": ("fleetclean.commands.info", "cmd_inventory"),
    "history": ("fleetclean.commands.history", "cmd_history"),
    "completion": ("fleetclean.commands.completion", "cmd_completion"),
    "__complete": ("fleetclean.commands.completion", "cmd_complete_names"),
    "demo": ("fleetclean.commands.info", "cmd_demo"),
    "sim": ("fleetclean.commands.info", "cmd_sim"),
}


def _handler(command: str) -> Handler:
    module, name = _HANDLERS[command]
    return cast(Handler, getattr(importlib.import_module(module), name))


def main(argv: Sequence[str] | None = None, env: Env | None = None) -> int:
    env = env or Env()
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
        _error_line(env, f"fleetclean: error: {exc}")
        return int(ExitStatus.BAD_INPUT)
    except FleetcleanError as exc:
        _error_line(env, f"fleetclean: error: {exc}")
        return int(ExitStatus.FAILED)
    except KeyboardInterrupt:
        _error_line(env, "fleetclean: interrupted")
        return int(ExitStatus.INTERRUPTED)
    except BrokenPipeError:
        return int(ExitStatus.OK)
    except Exception as exc:  # a bug: one line (or the traceback with --debug), exit 3
        if debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=env.stderr)
            env.stderr.flush()
        else:
            _error_line(env, internal_error_line(exc))
        return int(ExitStatus.INTERNAL)


def _wants_sim(argv: list[str]) -> bool:
    """Whether the command word is ``sim`` (the only one that needs its subcommands).

    >>> _wants_sim(["--debug", "sim", "up"]), _wants_sim(["status", "-i", "sim"])
    (True, False)
    """
    command = next((a for a in argv if not a.startswith("-")), "")
    return command == "sim"


def internal_error_line(exc: BaseException) -> str:
    """One line naming a bug: its type, message and where it was raised.

    >>> try:
    ...     {}["grace"]
    ... except KeyError as exc:
    ...     print(internal_error_line(exc))
    fleetclean: internal error (a bug): KeyError: 'grace' at <doctest ...>:2; rerun with --debug for the traceback
    """  # noqa: E501
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


def _error_line(env: Env, text: str) -> None:
    # Plain write, never wrapped: scripts grep this one line.
    env.stderr.write(" ".join(text.split()) + "\n")
    env.stderr.flush()


# --- shared steps -------------------------------------------------------------------------


def _select_hosts(args: argparse.Namespace, env: Env) -> list[Host]:
    from fleetclean.inventory import load_inventory, local_inventory

    # -F "" reads no ssh_config at all, like `ssh -F /dev/null`.
    ssh_config = args.ssh_config
    if ssh_config is None:
        ssh_config = env.environ.get("FLEETCLEAN_SSH_CONFIG")
    if args.limit is not None and not args.limit.strip():
        # `-l "$HOSTS"` with HOSTS unset must not mean every host of the fleet.
        raise UsageError("-l/--limit is empty, which would select every host",
                         hint="leave -l out (or write -l all) to mean every host")
    if args.local:
        if args.inventory or args.connection == "ssh":
            raise UsageError("--local is this machine alone, without SSH or an inventory",
                             hint="drop -i/-c, or use -i SOURCE -c local")
        inv = local_inventory()
    else:
        sources = _inventory_sources(args, env)
        if not sources:
            raise UsageError("no inventory given",
                             hint="give -i lab.yml or -i 'gpu01,gpu02,', --local for this "
                             "machine, or set FLEETCLEAN_INVENTORY")
        inv = load_inventory(sources, ssh_config=ssh_config)
    if args.connection:
        inv = inv.with_connection(args.connection)
    return inv.select(args.limit)


def _inventory_sources(args: argparse.Namespace, env: Env) -> list[str]:
    """Every -i, else $FLEETCLEAN_INVENTORY, else none."""
    if args.inventory:
        return list(args.inventory)
    default = env.environ.get("FLEETCLEAN_INVENTORY", "").strip()
    return [default] if default else []


def _inventory_label(args: argparse.Namespace, env: Env) -> str | None:
    """The inventory as a run record names it."""
    return "--local" if args.local else " + ".join(_inventory_sources(args, env)) or None


def _options(args: argparse.Namespace) -> Options:
    from fleetclean.transport import Options

    if args.forks < 1:
        raise UsageError(f"--forks must be at least 1, not {args.forks}")
    for flag, value in (("--connect-timeout", args.connect_timeout), ("--timeout", args.timeout)):
        if not math.isfinite(value) or value <= 0:  # nan and inf parse as floats
            raise UsageError(f"{flag} must be a positive number of seconds, not {value}",
                             hint=f"e.g. {flag} 30")
    return Options(
        connect_timeout=args.connect_timeout,
        timeout=args.timeout,
        known_hosts=tuple(args.known_hosts),
        accept_new_host_keys=args.accept_new_host_keys,
    )


def _render_jobs(
    playbook_ref: str, hosts: list[Host], extra: list[str], *, check: bool, force: bool
) -> tuple[str, list[fleet.Job], dict[str, Any]]:
    """Render every host's script before any connection: bad input never reaches a host."""
    from fleetclean import fleet
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.render import render_script
    from fleetclean.engine.variables import parse_extra_vars, resolve

    book = load_playbook(playbook_ref)
    extra_vars = parse_extra_vars(extra)
    jobs = []
    for host in hosts:
        resolved = resolve(book, host.vars, extra_vars)
        script = render_script(resolved, check=check, force=force, host_name=host.name)
        jobs.append(fleet.Job(host, script))
    return book.name, jobs, extra_vars


