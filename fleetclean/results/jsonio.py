"""The one JSON round trip: ``RunResult <-> dict``, for --json, run records and history.

``to_json`` writes DESIGN.md's --json contract; ``from_json`` reads it back (also from run
records written by older versions, whose ``summary`` may lack keys: it is recomputed from
the hosts, never trusted). Fields the contract does not carry (a stage's message and
changes, kernel-log Xids) come back empty.

Each GPU lists its processes as gpustat users know them (``pid``, ``user``, ``cmdline``,
``used_mib``), plus ``protected`` (why fleetclean never signals it, or null) and
``source`` (``compute-app``: nvidia-smi counts its memory; ``device-file``: it only has
``/dev/nvidiaN`` open) and ``stuck`` (true: in state D since fleetclean's SIGKILL). Each
host has ``verify``: {``rule``} naming what ended the verification (``clean``, ``leak``,
``stuck``, ``refused``, ``respawn``, ``deadline``, ``error``, ``skipped``; null when there
was none),
``left_running`` (the parents of killed GPU holders that live on, with their
process-group ancestors: [{``pid``, ``cmdline``}]) and ``stuck`` (processes in state D
after SIGKILL: [{``pid``, ``cmdline``}]) and ``resets`` (what a ``gpu-reset`` stage did:
[{``gpu``, ``result``: ok | failed | refused | would, ``detail``}]).

Every process of ``gpus[].processes`` and every entry of ``signalled`` carries ``owner``:
{``kind``, ``id``, ``name``} (null where the node could not say: a process outside its PID
namespace); a ``signal`` of ``stop`` means stopped through that owner (``systemctl
stop``, ``docker stop``). ``refused`` lists the targets left to their owner, never
signalled ([{``pid``, ``cmdline``, ``owner``, ``who``, ``fix``}]), ``warnings`` what a
person should know (an owner that may start again what was signalled).

>>> from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
>>> gpu = GpuRow(0, "GPU-0", "NVIDIA H200", 0, 143771)
>>> result = RunResult("status", 0.5, (HostResult("gpu01", HostStatus.CLEAN, gpus=(gpu,)),))
>>> data = to_json(result)
>>> data["summary"]
{'hosts': 1, 'clean': 1, 'dirty': 0, 'faulty': 0, 'failed': 0}
>>> from_json(data) == result
True
>>> from_json({"playbook": "status"})
Traceback (most recent call last):
...
ValueError: not a fleetclean result: missing key 'duration_s'
"""

from __future__ import annotations

from typing import Any

from fleetclean.models import (
    OWNER_KINDS,
    GpuProcess,
    GpuReset,
    GpuRow,
    HostResult,
    HostStatus,
    Owner,
    ProcessRef,
    Refusal,
    RunResult,
    Signalled,
    SlurmAction,
    StageResult,
)


def summary(result: RunResult) -> dict[str, int]:
    """Counts of hosts by outcome, as in --json's ``summary``."""
    hosts = result.hosts
    return {
        "hosts": len(hosts),
        "clean": sum(h.status is HostStatus.CLEAN for h in hosts),
        "dirty": sum(h.status is HostStatus.DIRTY for h in hosts),
        "faulty": sum(h.status is HostStatus.FAULTY for h in hosts),
        "failed": sum(h.status.failed for h in hosts),
    }


def to_json(result: RunResult) -> dict[str, Any]:
    """The --json object of DESIGN.md's contract (extra keys only where it allows)."""
    return {
        "playbook": result.playbook,
        "duration_s": result.duration_s,
        "summary": summary(result),
        "hosts": [host_json(h) for h in result.hosts],
    }


def host_json(h: HostResult) -> dict[str, Any]:
    data = _host_json(h)
    if h.judged_gpus is not None:
        data["gpus_judged"] = list(h.judged_gpus)
    if h.slurm is not None:
        data["slurm"] = {
            "action": h.slurm.action,
            "state_before": h.slurm.state_before,
            "state_after": h.slurm.state_after,
            "reason": h.slurm.reason,
        }
    return data


def _host_json(h: HostResult) -> dict[str, Any]:
    return {
        "host": h.host,
        "status": h.status.value,
        "error": h.error,
        "duration_s": h.duration_s,
        "stages": [
            {
                "name": s.name,
                "type": s.type,
                "status": s.status,
                "matched": s.matched,
                "signalled": s.signalled,
                "remaining": s.remaining,
                "duration_s": s.duration_s,
            }
            for s in h.stages
        ],
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_used_mib": g.memory_used_mib,
                "memory_total_mib": g.memory_total_mib,
                "processes": [process_json(p) for p in h.processes if p.gpu_uuid == g.uuid],
            }
            for g in h.gpus
        ],
        "signalled": signalled_json(h.signalled),
        "verify": {"rule": h.verify_rule},
        "left_running": [{"pid": p.pid, "cmdline": p.cmdline} for p in h.left_running],
        "stuck": [{"pid": p.pid, "cmdline": p.cmdline} for p in h.stuck],
        "resets": [{"gpu": r.gpu, "result": r.result, "detail": r.detail} for r in h.resets],
        "refused": [{"pid": r.pid, "cmdline": r.cmdline, "owner": owner_json(r.owner),
                     "who": r.who, "fix": r.fix} for r in h.refused],
        "warnings": list(h.warnings),
    }


def owner_json(o: Owner | None) -> dict[str, str] | None:
    return None if o is None else {"kind": o.kind, "id": o.id, "name": o.name}


def _owner(data: Any) -> Owner | None:
    if not data:
        return None
    kind = data.get("kind")
    return Owner(kind if kind in OWNER_KINDS else "plain", str(data.get("id", "")),
                 str(data.get("name", "")))


def process_json(p: GpuProcess) -> dict[str, Any]:
    return {"pid": p.pid, "user": p.user, "cmdline": p.name, "used_mib": p.used_memory_mib,
            "protected": p.protected or None,
            "source": "device-file" if p.device_only else "compute-app", "stuck": p.stuck,
            "owner": owner_json(p.owner)}


def signalled_json(signalled: tuple[Signalled, ...]) -> list[dict[str, Any]]:
    return [{"pid": s.pid, "cmdline": s.cmdline, "signal": s.signal, "match": s.match,
             "identity": s.identity, "owner": owner_json(s.owner)} for s in signalled]


def from_json(data: Any, *, interrupted: bool = False) -> RunResult:
    """The ``RunResult`` a --json object (or a run record's ``result``) describes.

    Raises ``ValueError`` naming what is missing or wrong, whatever the damage.
    """
    try:
        return RunResult(
            playbook=str(data["playbook"]),
            duration_s=float(data["duration_s"]),
            hosts=tuple(_host(h) for h in data["hosts"]),
            interrupted=interrupted,
        )
    except KeyError as exc:
        raise ValueError(f"not a fleetclean result: missing key {exc}") from None
    except (TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"not a fleetclean result: {exc}") from None


def _host(h: dict[str, Any]) -> HostResult:
    return HostResult(
        host=str(h["host"]),
        status=HostStatus(h["status"]),
        error=h.get("error"),
        duration_s=float(h.get("duration_s", 0.0)),
        stages=tuple(
            StageResult(s["name"], s["type"], s["status"], s.get("matched", 0),
                        s.get("signalled", 0), s.get("remaining", 0), s.get("duration_s", 0.0))
            for s in h.get("stages", ())
        ),
        gpus=tuple(
            GpuRow(g["index"], g["uuid"], g["name"], g.get("memory_used_mib"),
                   g.get("memory_total_mib"))
            for g in h.get("gpus", ())
        ),
        signalled=tuple(
            Signalled(s["pid"], s["cmdline"], s["signal"], match=s.get("match", ""),
                      identity=s.get("identity", ""), owner=_owner(s.get("owner")))
            for s in h.get("signalled", ())
        ),
        slurm=_slurm(h.get("slurm")),
        processes=tuple(
            GpuProcess(p["pid"], p.get("cmdline", ""), p.get("used_mib"), g["uuid"],
                       p.get("user", ""), p.get("protected") or "",
                       p.get("source") == "device-file", bool(p.get("stuck")),
                       _owner(p.get("owner")))
            for g in h.get("gpus", ()) for p in g.get("processes", ())
        ),
        verify_rule=(h.get("verify") or {}).get("rule"),
        left_running=_refs(h.get("left_running")),
        stuck=_refs(h.get("stuck")),
        resets=tuple(GpuReset(int(r["gpu"]), str(r["result"]), str(r.get("detail", "")))
                     for r in h.get("resets") or ()),
        judged_gpus=None if h.get("gpus_judged") is None else tuple(h["gpus_judged"]),
        refused=tuple(Refusal(int(r["pid"]), str(r.get("cmdline", "")), str(r["who"]),
                              str(r.get("fix", "")), _owner(r.get("owner")))
                      for r in h.get("refused") or ()),
        warnings=tuple(str(w) for w in h.get("warnings") or ()),
    )


def _refs(items: list[dict[str, Any]] | None) -> tuple[ProcessRef, ...]:
    return tuple(ProcessRef(int(p["pid"]), str(p.get("cmdline", ""))) for p in items or ())


def _slurm(s: dict[str, Any] | None) -> SlurmAction | None:
    if s is None:
        return None
    return SlurmAction(s["action"], s["state_before"], s["state_after"], s.get("reason", ""))
