"""Run the jobs with live progress, then print the result as a table, JSON or CSV, and
write the Prometheus file: the steps ``run`` and ``status`` share.

Each output's module (and rich with the table) is imported only when that output is asked
for: ``--json`` never loads rich, a pipe never draws the live display."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from fleetclean import fleet
from fleetclean.commands.env import Env, error_line
from fleetclean.commands.steps import fitted_forks, options
from fleetclean.errors import WRITE_FAILED, FleetcleanError, UsageError
from fleetclean.models import HostResult, RunResult
from fleetclean.results.lastseen import HistoryJudge, judged_by


def execute(name: str, jobs: list[fleet.Job], args: argparse.Namespace, env: Env) -> RunResult:
    opts = options(args)
    forks = fitted_forks(args, env, len(jobs)).forks
    cancel = threading.Event()
    # Faults that need each host's past (its GPU count, Xids since its last run): the
    # live view counts each host as the table will show it.
    judged = HistoryJudge([j.host for j in jobs])
    # A live view only for a person watching the table come: not for --json/--csv, not
    # into a pipe or log. It counts from the start but draws (and imports rich, and the
    # table's modules after it) once every host is handed out: rich's console is not
    # made, nor rich imported, before the first connection (results/live.py).
    if not (args.json or args.csv) and env.may_be_terminal(stderr=True):
        from fleetclean.results.live import LiveProgress

        with LiveProgress.deferred(lambda: env.console(stderr=True),
                                   [j.host.name for j in jobs],
                                   then=lambda: _prepare_output(args, judged)) as progress:
            result = fleet.run_fleet(jobs, playbook=name, opts=opts, forks=forks,
                                     on_event=judging(progress, judged), cancel=cancel,
                                     started_all=progress.begin)
    else:
        # The main thread only waits while the hosts run: the output's modules (rich and
        # the table, 20-25 ms) and the hosts' past are read meanwhile, not after the last
        # host (a live view's thread reads them once it draws). Only once every host is
        # handed out: begun before, they shared the one interpreter with the transport's
        # imports (fabric, paramiko: 57 ms here alone, 112 ms beside them) and put the
        # first connection ~50 ms later; begun after, they fill the hosts' wait on the
        # network.
        def prepare() -> None:
            threading.Thread(target=_prepare_output, args=(args, judged), daemon=True).start()

        result = fleet.run_fleet(jobs, playbook=name, opts=opts, forks=forks, cancel=cancel,
                                 started_all=prepare)
    return judged_by(result, judged)


def judging(progress: fleet.EventCallback, judged: Callable[[HostResult], HostResult]
            ) -> fleet.EventCallback:
    """``progress`` fed each finished host as the table will show it (``judged``). Where
    judging fails, the script's own verdict: the run's end judges every host again, on
    the main thread, and reports the failure there."""

    def on_event(event: fleet.Event) -> None:
        if event.result is not None:
            with contextlib.suppress(Exception):
                event = replace(event, result=judged(event.result))
        progress(event)

    return on_event


def _prepare_output(args: argparse.Namespace, judged: HistoryJudge) -> None:
    """Import what :func:`emit` will (as ``_emit_to`` chooses), and read the hosts' past:
    what fails here fails again where it is needed, and is reported there."""
    module = "jsonio" if args.json else "csvout" if args.csv else "table"
    with contextlib.suppress(Exception):
        importlib.import_module(f"fleetclean.results.{module}")
    with contextlib.suppress(Exception):
        judged.load()


def emit(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    """Print the result; a reader that went away (``| head``) does not change the exit
    status, which reports the hosts."""
    try:
        _emit_to(result, args, env)
        env.stdout.flush()
    except BrokenPipeError:
        _reader_gone(env)
    except OSError as exc:  # a full disk under `> out.json`: not a bug, and not a success
        if exc.errno not in WRITE_FAILED:
            raise
        raise FleetcleanError(
            f"the result could not be written to standard output: {exc.strerror}") from exc


def _emit_to(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    if args.json:
        import json

        from fleetclean.results import jsonio

        # One write: json.dump writes each token on its own, which is a system call
        # apiece where Python's output is unbuffered (PYTHONUNBUFFERED=1, common in ML
        # images): 84,000 of them for 256 hosts.
        env.stdout.write(json.dumps(jsonio.to_json(result), indent=2) + "\n")
    elif args.csv:
        from fleetclean.results import csvout

        csvout.write_csv(result, env.stdout)
    else:
        from fleetclean.results import table

        table.print_result(env.console(), result, full=args.all)


def check_prom(args: argparse.Namespace) -> None:
    """Refuse a --prom FILE that cannot be written, before anything is sent."""
    if args.prom is None:
        return
    path = Path(args.prom)
    if not args.prom or path.is_dir():
        raise UsageError(f"--prom {args.prom!r}: needs a file name",
                         hint="e.g. --prom /var/lib/node_exporter/textfile/fleetclean.prom")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"--prom {args.prom}: directory {parent} does not exist",
                         hint=f"create it (mkdir -p {parent}) or name another file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--prom {args.prom}: directory {parent} is not writable",
                         hint="name a file in a directory you can write")


def write_prom(result: RunResult, args: argparse.Namespace, env: Env) -> None:
    if args.prom is None:
        return
    from fleetclean.results import prom

    try:
        prom.write(result, args.prom, now=time.time())
    except OSError as exc:
        error_line(env, f"fleetclean: warning: --prom {args.prom} not written: {exc}")


def _reader_gone(env: Env) -> None:
    if env.stdout is sys.stdout:
        # Python would complain about the broken pipe again when it flushes at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def after_emit(env: Env) -> Iterator[None]:
    """What a command prints after the result (a --check listing, Slurm's lines): a reader
    gone by then (``| head``) leaves the exit status to the hosts, as in :func:`emit`; it
    reached the CLI's handler, which exits 0, and a dirty run read as clean."""
    try:
        yield
        env.stdout.flush()
    except BrokenPipeError:
        _reader_gone(env)
