"""The words a host's result gives a person: why a dirty GPU is dirty, and what else the
teardown saw that needs a person (a parent of killed GPU holders left running, a process
stuck in the kernel).

Compute apps come first (the processes whose memory nvidia-smi counts), one entry per PID
with the GPUs it holds; a /dev/nvidiaN holder is named only for a GPU no compute app
explains, and a protected daemon (nvidia-persistenced) only where it is all there is, as
such. A GPU with memory and no process is a driver-level leak, said with its remedy.

>>> from fleetclean.models import GpuProcess, GpuRow, ScriptReport
>>> gpus = (GpuRow(3, "G3", "H200", 1000, 143771), GpuRow(5, "G5", "H200", 512, 143771))
>>> procs = (GpuProcess(42, "python3 stub.py", 1000, "G3", "root", "protected name"),
...          GpuProcess(7, "/usr/bin/nvidia-persistenced", None, "G5", "root",
...                     "protected name", device_only=True))
>>> dirty_reason(ScriptReport(gpus=gpus, processes=procs, leaks=((5, 512),),
...                           verify_rule="leak"))  # doctest: +NORMALIZE_WHITESPACE
'GPU3 1000 MiB, GPU5 512 MiB; held by 42 python3 stub.py (root; GPU3; protected);
 GPU5: 512 MiB held by no process (driver-level leak): run nvidia-smi --gpu-reset -i 5
 or reboot (only 7 nvidia-persistenced (protected) has it open, using no memory)'
>>> from fleetclean.models import HostResult, HostStatus, ProcessRef
>>> notes(HostResult("gpu01", HostStatus.CLEAN, left_running=(
...     ProcessRef(17, "python3 -m vllm.entrypoints.openai.api_server --model /m"),
...     ProcessRef(18, "VLLM::EngineCore"))))  # doctest: +NORMALIZE_WHITESPACE
['left running: 17 python3 -m vllm.entrypoints.openai.api_server --model /m,
  18 VLLM::EngineCore (parent of killed GPU holders)']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetclean.models import GpuProcess, HostResult, Owner, Refusal, ScriptReport

_SHOWN = 3
# How a PID is written: as itself, or (``PID``) as what the problem lines fold hosts by
# where each host's processes have PIDs of their own (results/table.py: ``problems``).
PidWords = Callable[[int], str]
PID = "<pid>"


def as_placeholder(_pid: int) -> str:
    return PID

STUCK = "stuck in the kernel (state D) since SIGKILL: reboot or reset needed"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _name(cmdline: str) -> str:
    # A process in its exit has no command line left (its memory is already released).
    return _short(cmdline) if cmdline else "(exiting)"


def _judged(report: ScriptReport, index: int) -> bool:
    """Whether GPU ``index`` decides the status: every GPU, or only a scope's (--gpus, an
    epilog's job); the others are shown, not judged, and their holders not named."""
    return report.judged_gpus is None or index in report.judged_gpus


def owner_words(owner: Owner | None, refused: Sequence[Refusal] = ()) -> str:
    """Who runs a process, in a few words; empty for a plain one (or one the node could
    not say). A pod is named as its refusal names it, where there is one.

    >>> owner_words(Owner("docker", "3f2a1c9b8d7e" * 5, "3f2a1c9b8d7e"))
    'docker 3f2a1c9b8d7e'
    >>> pod = Owner("kubernetes", "0d3c-uid", "ab12")
    >>> owner_words(pod, [Refusal(41, "x", "pod ml/llm-0", "kubectl ...", pod)])
    'pod ml/llm-0'
    >>> owner_words(Owner("plain"))
    ''
    """
    if owner is None or owner.kind == "plain":
        return ""
    if owner.kind == "kubernetes":
        named = next((r.who for r in refused if r.owner is not None and r.owner.id == owner.id
                      and r.who.startswith("pod ") and "UID" not in r.who), "")
        return named or f"kubernetes pod {owner.id or '(no UID)'}"
    if owner.kind == "slurm":
        return f"slurm job {owner.name or owner.id}"
    return f"{owner.kind} {owner.name or owner.id}"


def refused_reason(refused: Sequence[Refusal], *, pid: PidWords = str) -> str:
    """The targets left to their owner, one part per owner, with what to do.

    >>> refused_reason([Refusal(41, "python3 x", "Slurm job 7 (user ada)", "scancel 7"),
    ...                 Refusal(42, "python3 y", "Slurm job 7 (user ada)", "scancel 7")])
    'not signalled, left to its owner: Slurm job 7 (user ada) (41, 42): scancel 7'
    """
    by_owner: dict[tuple[str, str], list[int]] = {}
    for r in refused:
        by_owner.setdefault((r.who, r.fix), []).append(r.pid)
    parts = [f"{who} ({', '.join(map(pid, sorted(pids)[:_SHOWN]))}"
             f"{', …' if len(pids) > _SHOWN else ''}): {fix}"
             for (who, fix), pids in by_owner.items()]
    return "not signalled, left to its owner: " + "; ".join(parts)


def _holders(report: ScriptReport, pid: PidWords) -> str:
    index_by_uuid = {g.uuid: g.index for g in report.gpus}
    by_pid: dict[int, tuple[GpuProcess, list[int]]] = {}
    for p in report.processes:
        if p.device_only and p.protected:
            continue  # named with the leak it sits beside, never as a holder
        if p.gpu_uuid in index_by_uuid and not _judged(report, index_by_uuid[p.gpu_uuid]):
            continue
        entry = by_pid.setdefault(p.pid, (p, []))
        index = index_by_uuid.get(p.gpu_uuid)
        if index is not None and index not in entry[1]:
            entry[1].append(index)
    parts = []
    for number in sorted(by_pid)[:_SHOWN]:
        p, indexes = by_pid[number]
        notes = [n for n in (p.user, ", ".join(f"GPU{i}" for i in sorted(indexes)),
                             owner_words(p.owner, report.refused),
                             "protected" if p.protected else "", STUCK if p.stuck else "")
                 if n]
        parts.append(f"{pid(number)} {_name(p.name)}" + (
            f" ({'; '.join(notes)})" if notes else ""))
    more = len(by_pid) - _SHOWN
    return ", ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def _leak(report: ScriptReport, index: int, mib: int, pid: PidWords) -> str:
    uuid = next((g.uuid for g in report.gpus if g.index == index), None)
    daemons = [p for p in report.processes
               if p.device_only and p.protected and p.gpu_uuid == uuid]
    what = ("driver-level leak" if report.verify_rule == "leak"
            else "a driver-level leak if it stays")
    text = (f"GPU{index}: {mib} MiB held by no process ({what}): "
            f"run nvidia-smi --gpu-reset -i {index} or reboot")
    if daemons:
        names = [f"{pid(p.pid)} {_short(p.name.split(' ')[0].rsplit('/', 1)[-1])} "
                 f"({'protected' if p.protected == 'protected name' else p.protected})"
                 for p in daemons]
        text += (f" (only {' and '.join(names)} {'has' if len(daemons) == 1 else 'have'} "
                 "it open, using no memory)")
    return text


def dirty_reason(report: ScriptReport, *, pid: PidWords = str) -> str:
    """Which GPUs are in use, who holds them, which are leaks, what respawned; each PID
    written by ``pid``."""
    busy = [g for g in report.gpus if g.memory_used_mib and _judged(report, g.index)]
    if len(busy) > 2:
        gpus = f"{len(busy)} GPUs in use ({sum(g.memory_used_mib or 0 for g in busy)} MiB)"
    else:
        gpus = ", ".join(f"GPU{g.index} {g.memory_used_mib} MiB" for g in busy) or "above limit"
    holders = _holders(report, pid)
    parts = [gpus + (f"; held by {holders}" if holders else "")]
    parts += [_leak(report, index, mib, pid) for index, mib in report.leaks
              if _judged(report, index)]
    if report.verify_message.startswith("respawned"):
        parts.append(report.verify_message)
    if report.refused:
        parts.append(refused_reason(report.refused, pid=pid))
    return "; ".join(parts)


def notes(host: HostResult, *, pid: PidWords = str) -> list[str]:
    """What a person should know beside the status: the parents of killed GPU holders
    that live on (a half-stopped server), processes stuck in the kernel that no GPU
    reason already names, each GPU reset with its result, and each warning of the
    teardown (an owner that may restart what was signalled); each PID written by ``pid``."""
    out = []
    if host.left_running:
        shown = ", ".join(f"{pid(p.pid)} {_name(p.cmdline)}" for p in host.left_running[:_SHOWN])
        more = len(host.left_running) - _SHOWN
        shown += f" (+{more} more)" if more > 0 else ""
        out.append(f"left running: {shown} (parent of killed GPU holders)")
    named = {p.pid for p in host.processes}
    stuck = [p for p in host.stuck if p.pid not in named]
    if stuck:
        out.append(f"{STUCK}: " + ", ".join(f"{pid(p.pid)} {_name(p.cmdline)}" for p in stuck))
    out += [f"GPU{r.gpu} reset: {r.result} ({r.detail})" for r in host.resets]
    out += [f"warning: {w}" for w in host.warnings]
    return out
