"""``fleetclean run PLAYBOOK``: render, run on every host, verify, record, report."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from fleetclean import fleet
from fleetclean.commands import slurm_step
from fleetclean.commands.env import Env, error_line
from fleetclean.commands.output import after_emit, check_prom, emit, execute, write_prom
from fleetclean.commands.steps import (
    ask_become_pass,
    inventory_label,
    inventory_sources,
    render_jobs,
    scope_of,
    select_hosts,
)
from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results import records, unheard
from fleetclean.slurm import options as slurm_options

if TYPE_CHECKING:
    from fleetclean.engine.model import Scope


def cmd_run(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    check_prom(args)
    slurm_options.check(args, inventory_sources(args, env))
    hosts = select_hosts(args, env, warn=True)
    scope = scope_of(args)
    # A teardown's token, which its journal on each node carries (results/unheard.py).
    run = "" if args.check else unheard.token()
    name, jobs, extra = render_jobs(args.playbook, hosts, args.extra_vars,
                                     check=args.check, force=args.force, scope=scope, run=run)
    jobs = ask_become_pass(args, jobs)
    record = None
    try:
        if not args.no_record:
            record = _start_record(name, jobs, args, env, argv=argv, extra=extra, scope=scope)
        if any(j.run for j in jobs):
            unheard.begin([j.host.name for j in jobs if j.run], run)
        result = execute(name, jobs, args, env)
    except KeyboardInterrupt:
        # Ctrl-C before the hosts' loop took over (the record just written, the transport
        # still loading on a slow machine): no host was started. Reported, recorded and
        # exited (130) as a run interrupted before any host's turn; a second Ctrl-C still
        # ends it at once. (Once the loop runs, fleet.run_fleet answers both.)
        result = _not_started(name, jobs)
    unheard.settle(result, run)
    result = slurm_step.apply(result, args, env, None if record is None else record.data["id"])
    if record is not None:
        try:
            path = record.finish(result)
            if not (args.json or args.csv):
                # soft_wrap: a path is one word, never broken, whatever the width.
                env.console(stderr=True).print(f"record: {path}", style="dim", markup=False,
                                               soft_wrap=True)
        except OSError as exc:
            error_line(env, f"fleetclean: warning: run record not completed: {exc}")
    write_prom(result, args, env)
    emit(result, args, env)
    with after_emit(env):
        slurm_step.print_lines(result, args, env)
        if args.check and not (args.json or args.csv):
            from fleetclean.results import table

            table.print_check(env.console(), result)
            if scope is not None:
                env.console().print(f"scope: only {scope.describe()}", markup=False,
                                    soft_wrap=True)
    return int(result.exit_status)


def _not_started(name: str, jobs: list[fleet.Job]) -> RunResult:
    # The words of fleet.run_jobs for the hosts an interrupted run never reached.
    why = "not started: the run was interrupted before this host's turn"
    hosts = tuple(HostResult(j.host.name, HostStatus.ERROR, why) for j in jobs)
    return RunResult(playbook=name, duration_s=0.0, hosts=hosts, interrupted=True)


def _start_record(
    name: str,
    jobs: list[fleet.Job],
    args: argparse.Namespace,
    env: Env,
    *,
    argv: list[str],
    extra: dict[str, Any],
    scope: Scope | None,
) -> records.RunRecord | None:
    """Write the record before the first connection, so that a controller killed mid-run
    still leaves a trace of what it was doing and where."""
    try:
        return records.RunRecord.start(
            playbook=name, hosts=[j.host.name for j in jobs], argv=argv,
            inventory=inventory_label(args, env), variables=extra, check=args.check,
            scope=scope.as_json() if scope else None,
        )
    except OSError as exc:
        error_line(env, f"fleetclean: warning: no run record: {exc}")
        return None
