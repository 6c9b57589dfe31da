"""``--drain-dirty`` and ``--resume-clean``: what to do with each host's Slurm node.

A host left ``faulty``, or ``dirty`` while no job runs on its node, is drained with the
reason ``fleetclean RUN_ID: STATUS: ERROR``; a ``clean`` host whose node fleetclean drained
(its reason prefix) is resumed. Never drained: a node where a job runs (``alloc``/``mixed``:
its GPU holders may well be the job's), a host that failed on the controller's side
(unreachable, authentication, host key, timeout, error: the node may be fine), a node
someone else drained (its reason is kept).

>>> from fleetclean.models import HostResult, HostStatus
>>> dirty = HostResult("node02", HostStatus.DIRTY, error="GPU2 4096 MiB; held by 77 python3")
>>> plan(dirty, NodeState("node02", "idle", ""), drain=True, resume=False, run_id="R1")
('drain', 'fleetclean R1: dirty: GPU2 4096 MiB; held by 77 python3')
>>> plan(dirty, NodeState("node02", "mixed", ""), drain=True, resume=False, run_id="R1")
('none', 'a job runs on node02: its GPU holders may belong to the job')
>>> clean = HostResult("node02", HostStatus.CLEAN)
>>> plan(clean, NodeState("node02", "drained", "fleetclean R1: dirty"), drain=True,
...      resume=True, run_id="R2")
('resume', 'clean now; drained by fleetclean R1: dirty')
>>> plan(clean, NodeState("node02", "drained", "bad DIMM"), drain=True, resume=True,
...      run_id="R2")
('none', 'drained by someone else: bad DIMM')
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from fleetclean.inventory.slurm import state_groups
from fleetclean.models import HostResult, HostStatus, RunResult, SlurmAction
from fleetclean.slurm import nodes as slurm_nodes
from fleetclean.slurm.nodes import NodeState, Runner, SlurmUnavailable

PREFIX = "fleetclean "
REASON_MAX = 120  # Slurm keeps longer reasons, but sinfo -R and squeue cut them


def plan(
    host: HostResult, node: NodeState, *, drain: bool, resume: bool, run_id: str
) -> tuple[str, str]:
    """``(action, reason)``: ``drain`` with the reason to set, ``resume``, or ``none``
    with why not."""
    groups = state_groups(node.state)
    drained = "state_drain" in groups
    if host.status is HostStatus.CLEAN:
        return _plan_clean(node, drained=drained, resume=resume)
    if host.status not in (HostStatus.DIRTY, HostStatus.FAULTY):
        return "none", f"{host.status.value}: a failure on the controller's side drains nothing"
    if drained:
        return "none", f"already drained: {node.reason}"
    if not drain:
        return "none", f"{host.status.value}; --drain-dirty not given"
    if {"state_alloc", "state_mixed"} & set(groups):
        return "none", f"a job runs on {node.name}: its GPU holders may belong to the job"
    why = f"{PREFIX}{run_id}: {host.status.value}"
    if host.error:
        why += f": {' '.join(host.error.split())}"
    return "drain", why[:REASON_MAX]


def _plan_clean(node: NodeState, *, drained: bool, resume: bool) -> tuple[str, str]:
    """A clean host: resumed only when fleetclean drained it and --resume-clean asks."""
    if not drained:
        return "none", "clean"
    if not node.reason.startswith(PREFIX):
        return "none", f"drained by someone else: {node.reason}"
    if not resume:
        return "none", "clean; --resume-clean not given"
    return "resume", f"clean now; drained by {node.reason}"


def node_name(host: str, known: dict[str, NodeState]) -> str | None:
    """The Slurm node of inventory host ``host``: its name, or its short name.

    >>> node_name("gpu01.lab", {"gpu01": NodeState("gpu01", "idle", "")})
    'gpu01'
    """
    for name in (host, host.split(".", maxsplit=1)[0]):
        if name in known:
            return name
    return None


def apply(
    result: RunResult,
    *,
    drain: bool,
    resume: bool,
    run_id: str,
    runner: Runner | None = None,
    query: Callable[[], dict[str, NodeState]] | None = None,
    update: Callable[..., None] | None = None,
) -> RunResult:
    """Drain/resume each host's node as :func:`plan` says; every host whose node Slurm
    knows gets its ``slurm`` record. Slurm's commands go through ``runner`` (this machine
    by default; a login node's for ``slurm://LOGINHOST``); tests pass ``query`` and
    ``update`` themselves. Raises SlurmUnavailable when sinfo cannot be read."""
    query = query or functools.partial(slurm_nodes.query, runner)
    update = update or functools.partial(slurm_nodes.update, runner=runner)
    before = query()
    planned: dict[str, tuple[str, str, str]] = {}
    for host in result.hosts:
        name = node_name(host.host, before)
        if name is None:
            continue
        action, reason = plan(host, before[name], drain=drain, resume=resume, run_id=run_id)
        try:
            if action == "drain":
                update(name, "State=DRAIN", f"Reason={reason}")
            elif action == "resume":
                update(name, "State=RESUME")
        except SlurmUnavailable as exc:
            action, reason = "error", str(exc)
        planned[host.host] = (name, action, reason)
    after = query() if any(a in ("drain", "resume") for _, a, _ in planned.values()) else before
    hosts = []
    for host in result.hosts:
        if host.host not in planned:
            hosts.append(host)
            continue
        name, action, reason = planned[host.host]
        state_after = after[name].state if name in after else before[name].state
        record = SlurmAction(action, before[name].state, state_after, reason)
        hosts.append(dataclasses.replace(host, slurm=record))
    return dataclasses.replace(result, hosts=tuple(hosts))


def summary_lines(result: RunResult) -> list[str]:
    """One line per node drained, resumed or not changed for a reason worth reading."""
    lines = []
    for host in result.hosts:
        s = host.slurm
        if s is None or (s.action == "none" and s.reason == "clean"):
            continue
        verb = {"drain": "drained", "resume": "resumed", "error": "not changed (error)"}
        change = f"{s.state_before} -> {s.state_after}"
        lines.append(f"{host.host}: slurm {verb.get(s.action, 'left')} ({change}): {s.reason}")
    return lines
