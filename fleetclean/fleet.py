"""Run one rendered script per host, many hosts at once; never prints.

Scripts are rendered for every host *before* the first connection (see ``cli``), so bad input
never reaches a host. Each host runs in a worker thread with bounded concurrency; what
happens on a host (including every failure) becomes a ``HostResult`` value, and progress is
reported through a callback so the caller decides how to show it.

Example::

    jobs = [Job(host, (script,)) for host, script in rendered]
    result = run_fleet(jobs, playbook="post-extraction", opts=Options(), forks=64)
    result.exit_status  # ExitStatus.OK when every host is clean
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetclean.models import Host, HostResult, HostStatus, RunResult, ScriptReport
from fleetclean.results import parse
from fleetclean.results.health import smi_pids_folded
from fleetclean.results.reasons import (
    PID,
    PidWords,
    as_placeholder,
    dirty_reason,
    refused_reason,
)
from fleetclean.transport import Options, ScriptOutput, dialing, limits

if TYPE_CHECKING:
    from fleetclean.transport.local import LocalSession
    from fleetclean.transport.session import Session


@dataclass(frozen=True)
class Job:
    """One host and its script, kept as pieces (``render.Renderer``): the pieces every
    host's script shares (the stage library, nearly all of it) are one string for the
    whole fleet, and a host's whole text exists only while that host runs.

    >>> job = Job(Host("gpu01", "gpu01"), ("echo ", "hi\\n"))
    >>> job.script
    'echo hi\\n'
    """

    host: Host
    pieces: tuple[str, ...]
    run: str = ""  # the teardown's token its script carries (results/unheard.py), if any

    @property
    def script(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class Event:
    """Progress of one host: ``kind`` is "start", "stage" (``stage`` names it) or "done"."""

    host: str
    kind: str
    stage: str = ""
    result: HostResult | None = None
    # "start": where the host's connection is while it connects, in words (None: no
    # step known), for a live view to ask (transport.dialing).
    dialing: Callable[[], str | None] | None = field(default=None, compare=False, repr=False)


EventCallback = Callable[[Event], None]


def run_fleet(
    jobs: Sequence[Job],
    *,
    playbook: str,
    opts: Options,
    forks: int | limits.Fit = 64,
    on_event: EventCallback | None = None,
    cancel: threading.Event | None = None,
    session: Session | None = None,
    started_all: Callable[[], None] | None = None,
) -> RunResult:
    """Run every job; a first KeyboardInterrupt stops starting hosts and waits for the
    running ones (they are bounded by their own timeouts); the result is then marked
    interrupted, also when it comes before the first host started. A second one closes
    every connection and waits only for what the running hosts had done by then
    (``ABANDON_S``): each host is in the result, as it ended, as left while it ran, or as
    not started. ``forks``: as many hosts at once, fitted here to the
    limits on open files and threads (``limits.fit_forks``), or a ``limits.Fit`` the
    caller made, taken as it is (the limits are read once). ``session``: the caller's own
    (kept connections, adopted ones), left open, with ``forks`` taken as it is; by
    default one for this run alone. ``started_all``: called (on this thread, and it must
    not block) once every host is handed to the pool, not where a Ctrl-C came first: work
    that the result needs only at the end starts there, out of the way of the imports and
    the reads before the first connection; a Ctrl-C during it counts as the first, an
    error in it is ignored."""
    cancel = cancel or threading.Event()
    started = time.monotonic()
    if isinstance(forks, limits.Fit):
        forks = forks.n
    elif session is None:
        forks = limits.fit_forks(forks).n  # never more in flight than files and threads allow
    # A caller's session's forks are not fitted again: a watch's would shrink at every
    # refresh (its kept connections' threads count in pids.current and against ulimit -u).
    if session is not None:
        return _run_all(jobs, playbook, session, forks=forks, on_event=on_event,
                        cancel=cancel, started=started, started_all=started_all)
    try:
        own = _session(jobs, opts)
    except KeyboardInterrupt:  # during that import: nothing has started anywhere
        return _result(jobs, playbook, {}, started, interrupted=True)
    with own:
        return _run_all(jobs, playbook, own, forks=forks, on_event=on_event, cancel=cancel,
                        started=started, started_all=started_all)


def _session(jobs: Sequence[Job], opts: Options) -> Session | LocalSession:
    # fabric, paramiko and invoke (~70 ms of imports) load only when a run needs SSH:
    # `--help`, `show`, `inventory` and a run of local hosts alone never load them.
    if all(job.host.connection == "local" for job in jobs):
        from fleetclean.transport.local import LocalSession

        return LocalSession(opts)
    from fleetclean.transport.session import Session

    return Session(opts)


def _run_all(
    jobs: Sequence[Job], playbook: str, session: Session | LocalSession, *, forks: int,
    on_event: EventCallback | None, cancel: threading.Event, started: float,
    started_all: Callable[[], None] | None = None,
) -> RunResult:
    emit = on_event or (lambda _e: None)
    results: dict[str, HostResult] = {}
    interrupted = False
    # Not a `with`: its exit joins every worker, which a second Ctrl-C must not wait for.
    pool = ThreadPoolExecutor(max_workers=max(1, forks))
    futures: dict[Future[HostResult | None], Job] = {}
    unstarted: set[str] = set()
    try:
        for job in jobs:
            # A job is queued before its thread is started: one whose thread failed may
            # still be taken by a running worker, which its gate then turns away.
            gate = threading.Event()
            try:
                future = pool.submit(_run_one, session, job, emit, cancel, gate=gate,
                                     unstarted=unstarted)
            except BaseException:
                unstarted.add(job.host.name)
                gate.set()
                raise
            futures[future] = job
            gate.set()
    except KeyboardInterrupt:  # hosts not submitted yet never start
        interrupted = True
        cancel.set()
    except RuntimeError as exc:
        # No thread to be had (ulimit -u, memory): the hosts already running go on, and
        # each host left is told so; it escaped before, with no host's result at all.
        for job in jobs[len(futures):]:
            results[job.host.name] = HostResult(
                job.host.name, HostStatus.ERROR,
                f"not started: the controller could not start a thread ({exc}); lower "
                "--forks or raise its limit (ulimit -u)")
    if started_all is not None and not interrupted:
        # Best effort, and hosts already run: a Ctrl-C here is the first one (below), and
        # a hook that fails (no thread to be had) costs the run nothing.
        try:
            started_all()
        except KeyboardInterrupt:
            interrupted = True
            cancel.set()
        except Exception:  # what it readies is made again at the end
            pass
    pending = set(futures)
    while pending:
        # as_completed, not wait(FIRST_COMPLETED) in a loop: each wait() hangs a waiter on
        # every pending future and takes it off again, O(hosts) per finished host, 0.7 s
        # of the main thread's CPU at 1,000 hosts and 2.1 s at 2,000.
        try:
            for fut in as_completed(pending):
                res = fut.result()
                if res is not None:
                    results[futures[fut].host.name] = res
                pending.discard(fut)
        except KeyboardInterrupt:
            if interrupted:
                left = _abandon(session, pool, pending, futures, results)
                return _result(jobs, playbook, results, started, interrupted=True, left=left)
            interrupted = True
            cancel.set()
    pool.shutdown()
    return _result(jobs, playbook, results, started,
                   interrupted=interrupted or cancel.is_set())


# How long a second Ctrl-C waits for the hosts whose connections it closed to say what they
# had done: each returns as soon as its read loop sees its channel closed.
ABANDON_S = 2.0
LEFT = ("interrupted while it ran: fleetclean stopped waiting (a second Ctrl-C); a "
        "teardown goes on there alone, and the host's next run says what it did")


def _abandon(session: Session | LocalSession, pool: ThreadPoolExecutor,
             pending: set[Future[HostResult | None]],
             futures: dict[Future[HostResult | None], Job],
             results: dict[str, HostResult]) -> set[str]:
    """A second Ctrl-C: stop waiting for the running hosts. Their connections close now,
    and each says what it had done until then (a signal it sent stays in the record)
    within ``ABANDON_S``, into ``results``; the names of those that said nothing by then
    (recorded as left, never as not started). A further Ctrl-C meanwhile is not a way out
    of saying what happened: it is ignored here, where it can be (the main thread)."""
    held = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if held else None
    try:
        session.abort()
        pool.shutdown(wait=False, cancel_futures=True)
        # A cancelled future (a host never started) never completes as_completed's wait.
        running = {f for f in pending if not f.cancelled()}
        try:
            for fut in as_completed(running, timeout=ABANDON_S):
                running.discard(fut)
                res = fut.result()
                if res is not None:
                    results[futures[fut].host.name] = res
        except FuturesTimeout:  # not the builtin TimeoutError before Python 3.11
            pass
        return {futures[f].host.name for f in running}
    finally:
        if held:
            signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)


def _result(jobs: Sequence[Job], playbook: str, results: dict[str, HostResult],
            started: float, *, interrupted: bool, left: set[str] | None = None) -> RunResult:
    ordered = []
    for job in jobs:
        res = results.get(job.host.name)
        if res is None:
            abandoned = job.host.name in (left or ())
            res = HostResult(
                job.host.name,
                HostStatus.ERROR,
                LEFT if abandoned else
                "not started: the run was interrupted before this host's turn",
                started=abandoned,  # its script may run on (results/unheard.py)
            )
        ordered.append(res)
    return RunResult(
        playbook=playbook,
        duration_s=round(time.monotonic() - started, 3),
        hosts=tuple(ordered),
        interrupted=interrupted,
    )


def _run_one(
    session: Session | LocalSession, job: Job, emit: EventCallback, cancel: threading.Event,
    *, gate: threading.Event | None = None, unstarted: set[str] | None = None,
) -> HostResult | None:
    if gate is not None:
        gate.wait()  # its submit has returned, or failed (then it is in unstarted)
    if cancel.is_set() or (unstarted is not None and job.host.name in unstarted):
        return None
    name = job.host.name
    emit(Event(name, "start", dialing=dialing.probe()))
    t0 = time.monotonic()

    def on_line(line: str) -> None:
        stage = parse.stage_started(line)
        if stage:
            emit(Event(name, "stage", stage))

    output = session.run(job.host, job.pieces, on_line)
    result = host_result(name, output, time.monotonic() - t0,
                         where=f"{job.host.address}:{job.host.port or 22}")
    emit(Event(name, "done", result=result))
    return result


def host_result(name: str, output: ScriptOutput, duration_s: float,
                where: str = "") -> HostResult:
    """Decide a host's status from what the transport and the script said; ``where``:
    the address and port it was dialled at (``HostResult.where``)."""
    report = (
        parse.parse_script_output(output.stdout, output.stderr, output.exit_code)
        if output.started
        else ScriptReport()
    )
    status, error = _status(output, report)
    # The same words with each PID a placeholder, kept only where they differ: what the
    # problem lines fold hosts by (each host's server has PIDs of its own, and so has each
    # nvidia-smi left waiting in a hung driver).
    folded = error
    if status is HostStatus.DIRTY:
        folded = _status(output, report, as_placeholder)[1]
    elif error and status in (HostStatus.FAULTY, HostStatus.ERROR):
        folded = smi_pids_folded(error, PID)
    return HostResult(
        host=name,
        status=status,
        error=error,
        duration_s=round(duration_s, 3),
        stages=report.stages,
        gpus=report.gpus,
        processes=report.processes,
        signalled=report.signalled,
        verify_rule=report.verify_rule,
        xids=report.xids,
        left_running=report.left_running,
        stuck=report.stuck,
        resets=report.resets,
        judged_gpus=report.judged_gpus,
        refused=report.refused,
        warnings=report.warnings,
        started=output.started,
        ended=report.ended,
        answered=report.answered,
        where=where,
        error_folded=folded if folded != error else None,
    )


def _status(output: ScriptOutput, report: ScriptReport,
            pid: PidWords = str) -> tuple[HostStatus, str | None]:
    """The host's status and the words that say why, each PID written by ``pid``."""
    if output.failure is not None:
        message = output.failure.message
        if output.started and report.stages:
            done = ", ".join(f"{s.name}: {s.status}" for s in report.stages)
            message += f" (stages reported before that: {done})"
        return HostStatus(output.failure.kind), message
    if report.faults:
        # A GPU no kill can fix says more than what else went wrong on the host.
        return HostStatus.FAULTY, "; ".join([*report.faults, *filter(None, [report.error])])
    if report.error:
        return HostStatus.ERROR, report.error
    # "denied": a target this login may not signal lives on; the host is dirty even if no
    # GPU shows it, and the message names every such process first.
    denied = _denied_reason(report)
    if report.verified is False:
        return HostStatus.DIRTY, "; ".join(filter(None, (denied, dirty_reason(report, pid=pid))))
    failed = [f"{s.name}: {s.message or 'failed'}" for s in report.stages if s.status == "failed"]
    if failed or denied:
        return HostStatus.DIRTY, "; ".join(filter(None, (denied, *failed)))
    if report.refused:
        # Left to their owner: the teardown did not do what was asked, GPUs or not.
        return HostStatus.DIRTY, refused_reason(report.refused, pid=pid)
    return HostStatus.CLEAN, None


def _denied_reason(report: ScriptReport) -> str:
    """The first denied stage's list (later stages name the same processes again)."""
    denied = [s for s in report.stages if s.status == "denied"]
    if not denied:
        return ""
    first = denied[0]
    _, _, listed = first.message.partition("not permitted: ")
    return f"{first.name}: not permitted: {listed}"
