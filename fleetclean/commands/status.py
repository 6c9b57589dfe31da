"""``fleetclean status``: the read-only GPU table, once or refreshed in place (--watch)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from fleetclean.commands import slurm_step
from fleetclean.commands.env import Env
from fleetclean.commands.output import check_prom, emit, execute, write_prom
from fleetclean.commands.steps import (
    ask_become_pass,
    fitted_forks,
    inventory_sources,
    options,
    render_jobs,
    scope_of,
    select_hosts,
)
from fleetclean.errors import ExitStatus
from fleetclean.results.lastseen import apply_history
from fleetclean.slurm import options as slurm_options

if TYPE_CHECKING:
    from fleetclean import fleet


def cmd_status(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    if args.watch is not None and env.own_process:
        # Before anything is said, asked or sent: this may start the process again.
        from fleetclean.commands.memory import thread_caches_off

        thread_caches_off(env.environ)
    check_prom(args)
    slurm_options.check(args, inventory_sources(args, env))
    hosts = select_hosts(args, env, warn=True)
    name, jobs, _ = render_jobs("status", hosts, args.extra_vars, check=False, force=False,
                                scope=scope_of(args))
    jobs = ask_become_pass(args, jobs)
    if args.watch is None:
        result = execute(name, jobs, args, env)
        result = slurm_step.apply(result, args, env, None)
        write_prom(result, args, env)
        emit(result, args, env)
        slurm_step.print_lines(result, args, env)
        return int(result.exit_status)
    return _watch(name, jobs, args, env)


def _watch(name: str, jobs: list[fleet.Job], args: argparse.Namespace, env: Env) -> int:
    """Refresh until Ctrl-C on one session that keeps each host's connection: one
    handshake per host for the whole watch, a new one only for a host that dropped."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from fleetclean import fleet
    from fleetclean.results import table
    from fleetclean.transport.session import Session

    opts = options(args)
    # One file and one thread a host between refreshes: 1,000 hosts come within a few
    # files of Linux's usual soft limit (1,024, with the run's own), far past macOS's
    # (256), and past a container's pids limit of 1,024.
    forks, kept = fitted_forks(args, env, len(jobs), keep=True)
    console = env.console()
    try:
        with Session(opts, keep=True, keep_at_most=kept.n) as session, \
                Live(console=console, auto_refresh=False) as live:
            while True:
                result = fleet.run_fleet(jobs, playbook=name, opts=opts, forks=forks,
                                         session=session)
                if result.interrupted:
                    break
                result = apply_history(result, [j.host for j in jobs])
                write_prom(result, args, env)
                view = Group(
                    Text(f"every {args.watch:g}s, last {time.strftime('%H:%M:%S')}; "
                         "Ctrl-C to stop", style="dim"),
                    table.render_result(result, full=args.all,
                                        max_hosts=table.screenful(console) - 2),
                )
                live.update(view, refresh=True)
                time.sleep(max(0.1, args.watch))
    except KeyboardInterrupt:
        pass
    return int(ExitStatus.INTERRUPTED)
