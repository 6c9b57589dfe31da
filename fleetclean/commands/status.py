"""``fleetclean status``: the read-only GPU table, once or refreshed in place (--watch)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, NamedTuple

from fleetclean.commands import slurm_step
from fleetclean.commands.env import Env
from fleetclean.commands.output import after_emit, check_prom, emit, execute, write_prom
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
from fleetclean.results import lastclean, unheard
from fleetclean.results.lastseen import apply_history
from fleetclean.slurm import options as slurm_options

if TYPE_CHECKING:
    from fleetclean import fleet
    from fleetclean.models import Host, RunResult


def cmd_status(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    if args.watch is not None and env.own_process:
        # Before anything is said, asked or sent: this may start the process again.
        from fleetclean.commands.memory import thread_caches_off

        thread_caches_off(env.environ)
    check_prom(args)
    slurm_options.check(args, inventory_sources(args, env))
    hosts = select_hosts(args, env, warn=True)
    if args.watch is not None:
        return _watch(*_watch_jobs(hosts, args), args, env)
    name, jobs, _ = render_jobs("status", hosts, args.extra_vars, check=False, force=False,
                                scope=scope_of(args))
    jobs = ask_become_pass(args, jobs)
    result = execute(name, jobs, args, env)
    unheard.settle(result)
    if not result.interrupted:
        lastclean.update(result)
    result = slurm_step.apply(result, args, env, None)
    write_prom(result, args, env)
    emit(result, args, env)
    with after_emit(env):
        slurm_step.print_lines(result, args, env)
    return int(result.exit_status)


def _watch_jobs(hosts: list[Host], args: argparse.Namespace
                ) -> tuple[str, list[fleet.Job], Reads]:
    """Both scripts of every host, so that each refresh sends each host the one that fits
    what the refresh before it saw (the processes it named read while -q runs, or the
    script of a host seen clean: render.Renderer.pieces; the node's count of CUDA processes
    picks its GPU read either way, or where it cannot be read, which script it is:
    render.early_reads); the first by :mod:`lastclean`'s hints. The password (-K) is
    asked once."""
    from fleetclean import fleet

    named, asked = lastclean.named(), unheard.load()
    name, each_q, _ = render_jobs("status", hosts, args.extra_vars, check=False, force=False,
                                  scope=scope_of(args), last_clean=(), named=named,
                                  unheard=asked)
    _, each_gpu, _ = render_jobs("status", hosts, args.extra_vars, check=False, force=False,
                                 scope=scope_of(args), last_clean={h.name for h in hosts},
                                 unheard=asked)
    each_q = ask_become_pass(args, each_q)
    known = lastclean.load()
    reads = {q.host.name: Read(q.host, q.pieces, g.pieces, named.get(q.host.name, ""),
                               asked.get(q.host.name, ""))
             for q, g in zip(each_q, each_gpu, strict=True)}
    jobs = [fleet.Job(q.host, g.pieces if q.host.name in known else q.pieces)
            for q, g in zip(each_q, each_gpu, strict=True)]
    return name, jobs, reads


class Read(NamedTuple):
    """A host's two scripts in a watch: the one for a host in use (``q``: reading the
    processes ``named`` by the refresh before, PID:START each, while its -q read runs), and
    the one for a host seen clean (``gpu``: the -q read's code parsed only where the node's
    count asks for -q, and the query read where the count cannot be read); both ask for the
    tokens ``asked`` of teardowns whose end was not heard (:mod:`unheard`). The node's
    count picks the GPU read of either but a named host's."""

    host: Host
    q: tuple[str, ...]
    gpu: tuple[str, ...]
    named: str
    asked: str


Reads = dict[str, Read]


def _watch(name: str, jobs: list[fleet.Job], reads: Reads, args: argparse.Namespace,
           env: Env) -> int:
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
                unheard.settle(result)
                lastclean.update(result)
                jobs = _next_reads(jobs, result, reads, args)
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


def _next_reads(jobs: list[fleet.Job], result: RunResult, reads: Reads,
                args: argparse.Namespace) -> list[fleet.Job]:
    """The jobs of the next refresh: each host's script that fits what this refresh saw
    (:class:`Read`), rendered anew where what it carries
    changed (rendering is the controller's: under 1 ms a host): the PIDs named, which a -q
    read reads early, and the tokens asked for, which this refresh's answers settled or a
    teardown run meanwhile (from another terminal) left unheard."""
    from fleetclean import fleet

    seen = {h.host: lastclean.clean(h) for h in result.hosts}
    asked = unheard.load()
    want = {}
    for host in result.hosts:
        read = reads.get(host.host)
        if read is None:
            continue
        named = read.named if seen[host.host] else lastclean.hint(lastclean.processes_named(host))
        want[host.host] = read._replace(named=named, asked=asked.get(host.host, ""))
    for w in _rendered([w for w in want.values() if (w.named, w.asked) != (
            reads[w.host.name].named, reads[w.host.name].asked)], args, q=True):
        want[w.host.name] = want[w.host.name]._replace(q=w.q)
    for w in _rendered([w for w in want.values() if w.asked != reads[w.host.name].asked],
                       args, q=False):
        want[w.host.name] = want[w.host.name]._replace(gpu=w.gpu)
    reads.update(want)
    out = []
    for job in jobs:
        read = reads[job.host.name]
        out.append(fleet.Job(read.host, read.gpu if seen.get(job.host.name) else read.q))
    return out


def _rendered(reads: list[Read], args: argparse.Namespace, *, q: bool) -> list[Read]:
    """``reads`` with their script for a host in use (``q``) or for one seen clean rendered
    anew, for what each carries."""
    if not reads:
        return []
    _, jobs, _ = render_jobs(
        "status", [r.host for r in reads], args.extra_vars, check=False, force=False,
        scope=scope_of(args), last_clean=() if q else [r.host.name for r in reads],
        named={r.host.name: r.named for r in reads},
        unheard={r.host.name: r.asked for r in reads})
    return [r._replace(q=j.pieces) if q else r._replace(gpu=j.pieces)
            for r, j in zip(reads, jobs, strict=True)]
