"""``fleetclean history [ID]``: list run records, or show what one run changed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from fleetclean.commands.env import Env
from fleetclean.errors import ExitStatus, UsageError
from fleetclean.results import records
from fleetclean.results.jsonio import summary
from fleetclean.results.table import summary_line
from fleetclean.results.words import counted, printable


def cmd_history(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    if args.record:
        return _show_one(args, env)
    found = False
    for data in records.read_records():
        found = True
        env.stdout.write(list_line(data) + "\n")
    if not found:
        env.stdout.write(f"no run records in {records.runs_dir()}\n")
    return int(ExitStatus.OK)


def list_line(data: dict[str, Any]) -> str:
    """One record as a line of ``fleetclean history``."""
    result = records.record_result(data)
    if result is None:
        outcome = (f"{counted(len(data.get('hosts', [])), 'host')}  INCOMPLETE: the "
                   "controller stopped before the end; see 'fleetclean history ID'")
    else:
        s = summary(result)
        outcome = (f"{counted(s['hosts'], 'host')} {s['clean']} clean {s['dirty']} dirty "
                   + (f"{s['faulty']} faulty " if s["faulty"] else "")
                   + f"{s['failed']} failed")
    return (f"{data['id']}  {data['started_at']}  {data['playbook']:<16} {outcome}"
            f"{'  (check)' if data.get('check') else ''}"
            f"{'  (interrupted)' if data.get('interrupted') else ''}")


def _show_one(args: argparse.Namespace, env: Env) -> int:
    try:
        record = records.load_record(args.record)
    except FileNotFoundError as exc:
        raise UsageError(f"no run record matches {args.record!r}: {exc}",
                         hint="'fleetclean history' lists them") from None
    if args.json:
        env.stdout.write(json.dumps(record, indent=2) + "\n")  # one write (see output)
        return int(ExitStatus.OK)
    console = env.console()
    console.print(f"{record['id']}  {record['user']}@{record['controller']}  "
                  f"{' '.join(record['argv'])}", markup=False)
    _print_changes(console, record)
    result = records.record_result(record)
    if result is None:
        console.print("INCOMPLETE: the controller stopped before the end; what ran on "
                      f"{', '.join(record.get('hosts', []))} is unknown: check with "
                      "'fleetclean status'", markup=False)
    else:
        console.print(summary_line(result), markup=False)
    return int(ExitStatus.OK)


def _print_changes(console: Console, record: dict[str, Any]) -> None:
    for host, change in record.get("changes", {}).items():
        # What the host said, escaped: a command line may hold anything (words.printable).
        for s in change["signalled"]:
            console.print(printable(f"  {host}: SIG{s['signal']} {s['pid']} {s['cmdline']}"),
                          markup=False)
        for c in change["changes"]:
            console.print(printable(f"  {host}: {c}"), markup=False)
