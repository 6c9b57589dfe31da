"""Command line: options -> calls. The one place that maps errors to exit statuses.

``main(argv, env) -> int`` never calls ``sys.exit`` itself and prints only through the
``Env`` it is given, so tests can swap the streams.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from fleetclean import __version__, fleet, records, report
from fleetclean.errors import BadInput, FleetcleanError, UsageError
from fleetclean.models import ExitStatus, Host, RunResult
from fleetclean.transport import Options

EPILOG_RUN = """\
examples:
  fleetclean run post-extraction -i lab.yml -l extraction
  fleetclean run post-extraction -i lab.yml -e model_file=/opt/sglang/srt/models/deepseek_v2.py
  fleetclean run pre-restart -i lab.yml -l 'gpu0*:!gpu05' --check
  fleetclean run ./my-teardown.yaml -i hosts.ini -e @vars.yaml --json > result.json

exit status: 0 every host clean, 1 some host dirty, 2 some host unreachable or failed,
4 bad input (nothing was sent), 130 interrupted.
"""

EPILOG_MAIN = """\
examples:
  fleetclean demo                                   a simulated fleet, cleaned end to end
  fleetclean status -i lab.yml                      per-host, per-GPU memory table
  fleetclean run post-extraction -i lab.yml --check what would be signalled, restored, removed
  fleetclean run post-extraction -i lab.yml         stop servers, free GPUs, verify
  fleetclean show post-extraction -i lab.yml --host gpu01   the exact bash sent to gpu01
"""


@dataclass
class Env:
    """The streams and environment one invocation uses; tests pass their own."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def console(self, *, stderr: bool = False) -> Console:
        stream = self.stderr if stderr else self.stdout
        no_color = "NO_COLOR" in self.environ
        return Console(file=stream, no_color=no_color, highlight=False, soft_wrap=False)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad options; the contract says 4 and one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", hint=f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
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
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def hosts_opts(sp: argparse.ArgumentParser, *, required: bool = True) -> None:
        sp.add_argument("-i", "--inventory", required=required, metavar="FILE",
                        help="Ansible inventory (YAML or INI)")
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
    conn_opts(run)

    status = sub.add_parser("status", help="read-only GPU memory table of the selected hosts",
                            epilog="examples:\n  fleetclean status -i lab.yml\n"
                            "  fleetclean status -i lab.yml -l training --watch 2\n",
                            formatter_class=fmt)
    hosts_opts(status)
    status.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE",
                        help="set a variable of the status playbook (e.g. max_used_mib=512)")
    status.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="S",
                        help="refresh the table in place every S seconds (default 2)")
    conn_opts(status)

    show = sub.add_parser("show", help="print the exact script a host would receive",
                          epilog="examples:\n  fleetclean show post-extraction\n"
                          "  fleetclean show post-extraction -i lab.yml --host gpu01 -e grace=30\n",
                          formatter_class=fmt)
    show.add_argument("playbook", metavar="PLAYBOOK")
    hosts_opts(show, required=False)
    show.add_argument("--host", metavar="HOST", help="render with this host's variables")
    show.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--check", action="store_true", help="render the --check variant")

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

    demo = sub.add_parser("demo", help="clean a local simulated fleet end to end (Linux, root)")
    demo.add_argument("--nodes", type=int, default=4, metavar="N")
    demo.add_argument("--state-dir", metavar="DIR", help="where the simulated fleet lives")

    sim = sub.add_parser("sim", help="drive the simulated fleet by hand (Linux, root)")
    from fleetclean.sim import cli as sim_cli

    sim_cli.add_subparsers(sim)
    return p


def main(argv: Sequence[str] | None = None, env: Env | None = None) -> int:
    env = env or Env()
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        if not args.command:
            build_parser().print_help(env.stdout)
            return int(ExitStatus.OK)
        handler = _HANDLERS[args.command]
        return handler(args, env, args_list)
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


def _error_line(env: Env, text: str) -> None:
    # Plain write, never wrapped: scripts grep this one line.
    env.stderr.write(" ".join(text.split()) + "\n")
    env.stderr.flush()


# --- shared steps -------------------------------------------------------------------------


def _select_hosts(args: argparse.Namespace, env: Env) -> list[Host]:
    from fleetclean.inventory import load_inventory

    # -F "" reads no ssh_config at all, like `ssh -F /dev/null`.
    ssh_config = args.ssh_config
    if ssh_config is None:
        ssh_config = env.environ.get("FLEETCLEAN_SSH_CONFIG")
    if args.limit is not None and not args.limit.strip():
        # `-l "$HOSTS"` with HOSTS unset must not mean every host of the fleet.
        raise UsageError("-l/--limit is empty, which would select every host",
                         hint="leave -l out (or write -l all) to mean every host")
    inv = load_inventory(args.inventory, ssh_config=ssh_config)
    return inv.select(args.limit)


def _options(args: argparse.Namespace) -> Options:
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


def _execute(
    name: str, jobs: list[fleet.Job], args: argparse.Namespace, env: Env
) -> RunResult:
    opts = _options(args)
    live = not (args.json or args.csv)
    console = env.console(stderr=True)
    cancel = threading.Event()
    if live:
        with report.LiveProgress(console, [j.host.name for j in jobs]) as progress:
            return fleet.run_fleet(jobs, playbook=name, opts=opts, forks=args.forks,
                                   on_event=progress, cancel=cancel)
    return fleet.run_fleet(jobs, playbook=name, opts=opts, forks=args.forks, cancel=cancel)


def _emit(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    """Print the result; a reader that went away (``| head``) does not change the exit
    status, which reports the hosts."""
    try:
        _emit_to(result, args, env)
        env.stdout.flush()
    except BrokenPipeError:
        if env.stdout is sys.stdout:
            # Python would complain about the broken pipe again when it flushes at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _emit_to(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    if args.json:
        json.dump(report.to_json(result), env.stdout, indent=2)
        env.stdout.write("\n")
    elif args.csv:
        report.write_csv(result, env.stdout)
    else:
        report.print_result(env.console(), result)


# --- commands -----------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    hosts = _select_hosts(args, env)
    name, jobs, extra = _render_jobs(args.playbook, hosts, args.extra_vars,
                                     check=args.check, force=args.force)
    record = None if args.no_record else _start_record(name, jobs, args, env, argv=argv,
                                                       extra=extra)
    result = _execute(name, jobs, args, env)
    if record is not None:
        try:
            path = record.finish(result)
            if not (args.json or args.csv):
                env.console(stderr=True).print(f"record: {path}", style="dim", markup=False)
        except OSError as exc:
            _error_line(env, f"fleetclean: warning: run record not completed: {exc}")
    _emit(result, args, env)
    if args.check and not (args.json or args.csv):
        report.print_check(env.console(), result)
    return int(result.exit_status)


def _start_record(
    name: str,
    jobs: list[fleet.Job],
    args: argparse.Namespace,
    env: Env,
    *,
    argv: list[str],
    extra: dict[str, Any],
) -> records.RunRecord | None:
    """Write the record before the first connection, so that a controller killed mid-run
    still leaves a trace of what it was doing and where."""
    try:
        return records.RunRecord.start(
            playbook=name, hosts=[j.host.name for j in jobs], argv=argv,
            inventory=args.inventory, variables=extra, check=args.check,
        )
    except OSError as exc:
        _error_line(env, f"fleetclean: warning: no run record: {exc}")
        return None


def cmd_status(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    hosts = _select_hosts(args, env)
    name, jobs, _ = _render_jobs("status", hosts, args.extra_vars, check=False, force=False)
    if args.watch is None:
        result = _execute(name, jobs, args, env)
        _emit(result, args, env)
        return int(result.exit_status)
    opts = _options(args)
    console = env.console()
    try:
        with Live(console=console, auto_refresh=False) as live:
            while True:
                result = fleet.run_fleet(jobs, playbook=name, opts=opts, forks=args.forks)
                if result.interrupted:
                    break
                view = Group(
                    Text(f"every {args.watch:g}s, last {time.strftime('%H:%M:%S')}; "
                         "Ctrl-C to stop", style="dim"),
                    report.render_result(result),
                )
                live.update(view, refresh=True)
                time.sleep(max(0.1, args.watch))
    except KeyboardInterrupt:
        pass
    return int(ExitStatus.INTERRUPTED)


def cmd_show(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    hosts: list[Host]
    if args.inventory:
        hosts = _select_hosts(args, env)
        if args.host:
            hosts = [h for h in hosts if h.name == args.host]
            if not hosts:
                raise UsageError(f"--host {args.host}: no such host in {args.inventory}",
                                 hint="see 'fleetclean inventory -i FILE'")
        hosts = hosts[:1]
    else:
        if args.host:
            raise UsageError("--host needs -i INVENTORY")
        hosts = [Host(name="HOST", address="HOST")]
    _, jobs, _ = _render_jobs(args.playbook, hosts, args.extra_vars, check=args.check,
                              force=False)
    env.stdout.write(jobs[0].script)
    return int(ExitStatus.OK)


def cmd_playbooks(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.engine.playbook import list_playbooks

    for name, description in list_playbooks():
        env.stdout.write(f"{name:<18} {description}\n")
    return int(ExitStatus.OK)


def cmd_inventory(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.inventory import inventory_json, render_inventory_table

    hosts = _select_hosts(args, env)
    if args.json:
        json.dump(inventory_json(hosts), env.stdout, indent=2)
        env.stdout.write("\n")
    else:
        env.console().print(render_inventory_table(hosts))
    return int(ExitStatus.OK)


def cmd_history(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    if args.record:
        try:
            record = records.load_record(args.record)
        except FileNotFoundError as exc:
            raise UsageError(f"no run record matches {args.record!r}: {exc}",
                             hint="'fleetclean history' lists them") from None
        if args.json:
            json.dump(record, env.stdout, indent=2)
            env.stdout.write("\n")
            return int(ExitStatus.OK)
        console = env.console()
        console.print(f"{record['id']}  {record['user']}@{record['controller']}  "
                      f"{' '.join(record['argv'])}", markup=False)
        for host, change in record["changes"].items():
            for s in change["signalled"]:
                console.print(f"  {host}: SIG{s['signal']} {s['pid']} {s['cmdline']}",
                              markup=False)
            for c in change["changes"]:
                console.print(f"  {host}: {c}", markup=False)
        if record.get("result") is None:
            console.print("INCOMPLETE: the controller stopped before the end; what ran on "
                          f"{', '.join(record.get('hosts', []))} is unknown: check with "
                          "'fleetclean status'", markup=False)
        else:
            console.print(report.summary_line(_result_from_json(record["result"])),
                          markup=False)
        return int(ExitStatus.OK)
    paths = records.list_records()
    if not paths:
        env.stdout.write(f"no run records in {records.runs_dir()}\n")
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # damaged: history lists what it can read
        if not isinstance(data, dict) or not {"id", "started_at", "playbook"} <= data.keys():
            continue  # not a record of ours
        if not isinstance(data.get("result"), dict) or "summary" not in data["result"]:
            outcome = (f"{len(data.get('hosts', []))} hosts  INCOMPLETE: the controller "
                       "stopped before the end; see 'fleetclean history ID'")
        else:
            s = data["result"]["summary"]
            outcome = (f"{s['hosts']} hosts {s['clean']} clean {s['dirty']} dirty "
                       f"{s['failed']} failed")
        env.stdout.write(
            f"{data['id']}  {data['started_at']}  {data['playbook']:<16} {outcome}"
            f"{'  (check)' if data.get('check') else ''}"
            f"{'  (interrupted)' if data.get('interrupted') else ''}\n"
        )
    return int(ExitStatus.OK)


def _result_from_json(data: dict[str, Any]) -> RunResult:
    from fleetclean.models import HostResult, HostStatus

    hosts = tuple(
        HostResult(h["host"], HostStatus(h["status"]), h.get("error"), h.get("duration_s", 0))
        for h in data["hosts"]
    )
    return RunResult(data["playbook"], data["duration_s"], hosts)


def cmd_demo(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.demo import run_demo

    return run_demo(env.console(), nodes=args.nodes, state_dir=args.state_dir)


def cmd_sim(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    from fleetclean.sim import cli as sim_cli

    return sim_cli.run(args)


_HANDLERS: dict[str, Callable[[argparse.Namespace, Env, list[str]], int]] = {
    "run": cmd_run,
    "status": cmd_status,
    "show": cmd_show,
    "playbooks": cmd_playbooks,
    "inventory": cmd_inventory,
    "history": cmd_history,
    "demo": cmd_demo,
    "sim": cmd_sim,
}
