"""Script output -> :class:`ScriptReport`. Pure; needs no SSH to be tested.

Wire format (written by ``engine/stages/lib.sh``): one record per stdout line,
``@@fleetclean`` TAB kind TAB field..., each field percent-encoded (``%`` ``\\t`` ``\\n``
``\\r`` as ``%25 %09 %0A %0D``), so a command line or message holding tabs or newlines
cannot break the framing. Any other line (stray output, a banner) is ignored. Kinds:

=========  ==========================================================================
begin      version, playbook, host, check (0/1)
lock       ok | busy | none, lock path
stage      index, name, type             (a stage starts; "verify" for the verification)
match      index, pid, cmdline, why, identity   (a process the stage targets; why: the
           part its pattern matched, title|executable|module|script|code|cmdline, or
           tree|gpu)
signal     index, pid, TERM|KILL|..., cmdline, why, identity
stuck      index, pid, cmdline           (in state D after SIGKILL: stuck in the kernel)
unstuck    pid                           (a stuck process that ended before the script did)
change     index, text                   (what was or would be changed)
end        index, status, matched, signalled, remaining, milliseconds, message
error      message                       (host-level: busy, guard refusal)
nvsmi      exit status, nvidia-smi's own output
gpu        one --query-gpu CSV line (index, uuid, name, memory.used, memory.total), or
           the same fields read from ``nvidia-smi -q``
app        one --query-compute-apps CSV line (pid, process_name, used_memory, gpu_uuid),
           or the same fields read from ``nvidia-smi -q``
proc       pid, user, cmdline, why protected (empty: not), "stuck" or empty
           (once per PID the report names)
holder     pid, device file, cmdline, why protected, GPU index   (/dev/nvidiaN open, N
           the GPU's device minor; only for a GPU whose memory no compute app explains)
bare       GPU index, MiB                (above the threshold, no unprotected process holds it)
pages      GPU index, retired_pages.pending, remapped_rows.pending   (only when one is Yes)
boot       the node's boot time, epoch seconds   (before its xid records)
xid        seconds since boot, the kernel-log line of an NVIDIA Xid
verify     ok | dirty | unknown | error | skipped, max_used_mib, milliseconds, message,
           rule that ended it: clean | leak | stuck | refused | respawn | deadline | error
           | skipped
left       pid, cmdline                  (a parent of killed GPU holders that lives on)
owner      pid, kind, id, name           (who runs a matched process: engine/stages/owner.py)
scope      user, uid, job, GPUs judged, how they were given ("" | list | slurm)
refused    index, pid, cmdline, who, fix (a target left to its owner: never signalled)
warn       index, text                   (an owner that may start again what was signalled)
done       0                             (the script reached its end)
journal    the records of an earlier teardown here that lost its controller and went on
           alone (lib.sh: "the journal"), as it kept them, and "running" while it still
           holds the lock: results/journal.py says what it did
unheard    token                         (the node has told, or has nothing to tell of, the
           run with that token whose end the controller did not hear: lib.sh, the journal;
           results/unheard.py)
clock      start µs, end µs, exit status (a standalone script's: fleetclean report)
=========  ==========================================================================

The parser reads the generic kinds (begin, lock, stage, match, signal, stuck, unstuck,
change, end, error, left, done) itself; every other kind belongs to one stage type (the
verification's ``nvsmi``, ``gpu``, ``app``, ``holder``, ``verify``, ...; gpu-reset's
``reset``) and is read by the reader that type registers
(:func:`fleetclean.engine.stages.record_readers`). An unknown kind is ignored.

>>> r = parse_script_output("@@fleetclean\\tbegin\\t1\\tp\\th\\t0\\n"
...                         "@@fleetclean\\tstage\\t1\\tstop\\tsignal\\n", "", None)
>>> r.error
"output ended during stage 1 'stop' (signal): connection lost or script killed"
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import unquote

from fleetclean.engine.stages import record_readers
from fleetclean.engine.stages.base import Readings, StageReading
from fleetclean.models import (
    GpuProcess,
    GpuRow,
    ProcessRef,
    Refusal,
    ScriptReport,
    Signalled,
    StageResult,
    Xid,
)
from fleetclean.results.health import nvsmi_fault, pages_faults, parse_xid, value_faults
from fleetclean.results.nvsmi import (
    APP_FIELDS,
    GPU_FIELDS,
    NvsmiParseError,
    parse_compute_apps,
    parse_query_gpu,
)
from fleetclean.transport.boot import explained

MARKER = "@@fleetclean"

__all__ = [
    "MARKER",
    "parse_compute_apps",
    "parse_query_gpu",
    "parse_script_output",
    "stage_started",
]


def stage_started(line: str) -> str | None:
    """The stage name a single stdout line announces, for live progress; else None.

    >>> stage_started("@@fleetclean\\tstage\\t2\\tstop-server\\tsignal")
    'stop-server'
    >>> stage_started("some stray output") is None
    True
    """
    if not line.startswith(_STAGE_PREFIX):
        return None
    fields = line.rstrip("\r").split("\t")
    return unquote(fields[3]) if len(fields) > 3 else None


_STAGE_PREFIX = MARKER + "\tstage\t"


def _records(stdout: str) -> list[list[str]]:
    out = []
    # On "\n" alone: str.splitlines also breaks at \v, \f, \x1c-\x1e, \x85, U+2028 and
    # U+2029, which a field (a command line) may hold, unescaped (lib.sh escapes % \t \n
    # \r): its record cut in two lost its later fields (a refused process: a dirty host
    # read as clean).
    for raw in stdout.split("\n"):
        line = raw.rstrip("\r")
        if line.startswith(MARKER + "\t"):
            out.append([unquote(f) for f in line.split("\t")[1:]])
    return out


def _begin(st: Readings, a: list[str]) -> None:
    st.began = True


def _lock(st: Readings, a: list[str]) -> None:
    if a[0] == "busy":
        st.busy = True


def _stage(st: Readings, a: list[str]) -> None:
    st.stages[a[0]] = StageReading(name=a[1], type=a[2])
    st.current = a[0]


def _match(st: Readings, a: list[str]) -> None:
    """A targeted process: its signal record (or its absence) is what the report shows."""


def _signal(st: Readings, a: list[str]) -> None:
    stage = st.stages.get(a[0])
    st.signalled.append(Signalled(pid=int(a[1]), cmdline=a[3], signal=a[2],
                                  stage=stage.name if stage else "",
                                  match=a[4] if len(a) > 4 else "",
                                  identity=a[5] if len(a) > 5 else ""))


def _stuck(st: Readings, a: list[str]) -> None:
    st.stuck[int(a[1])] = a[2]


def _unstuck(st: Readings, a: list[str]) -> None:
    st.stuck.pop(int(a[0]), None)


def _left(st: Readings, a: list[str]) -> None:
    st.left.append(ProcessRef(int(a[0]), a[1]))


def _change(st: Readings, a: list[str]) -> None:
    st.stages[a[0]].changes.append(a[1])


def _end(st: Readings, a: list[str]) -> None:
    stage = st.stages[a[0]]
    stage.result = StageResult(
        name=stage.name, type=stage.type, status=a[1], matched=int(a[2]),
        signalled=int(a[3]), remaining=int(a[4]), duration_s=int(a[5]) / 1000,
        message=a[6], changes=tuple(stage.changes))
    st.current = None
    if a[1] == "failed":
        st.errors.append(f"stage '{stage.name}' failed: {a[6]}")


def _error(st: Readings, a: list[str]) -> None:
    st.errors.append(a[0])


def _done(st: Readings, a: list[str]) -> None:
    st.done = True


def _clock(st: Readings, a: list[str]) -> None:
    """When a standalone script ran (fleetclean report reads it): nothing for a run."""


def _journal(st: Readings, a: list[str]) -> None:
    """An earlier teardown here lost its controller and went on alone: what it did."""
    from fleetclean.results.journal import describe  # it parses the journal with this module

    st.warnings.append(describe(a[0], a[1] if len(a) > 1 else ""))


def _unheard(st: Readings, a: list[str]) -> None:
    """The node answered for an unheard run's token: told its journal, or has none."""
    st.answered.append(a[0])


def _scope(st: Readings, a: list[str]) -> None:
    """Only the GPUs of a --gpus or epilog scope are judged; the others are shown."""
    if a[4]:
        st.judged_gpus = [int(i) for i in a[3].split(",") if i.isdigit()]


_GENERIC: dict[str, Callable[[Readings, list[str]], None]] = {
    "begin": _begin, "lock": _lock, "stage": _stage, "match": _match, "signal": _signal,
    "stuck": _stuck, "unstuck": _unstuck, "change": _change, "end": _end, "error": _error,
    "left": _left, "done": _done, "scope": _scope, "clock": _clock, "journal": _journal,
    "unheard": _unheard,
}

def parse_script_output(stdout: str, stderr: str, exit_code: int | None) -> ScriptReport:
    """Turn one host's script output into a report; never raises on odd output.

    ``verified`` is True when every GPU ended at or under the threshold, False when the
    deadline passed with one above it, None when no verification completed. ``error``
    names the first host-level problem a person must act on.
    """
    st = Readings()
    readers = {**record_readers(), **_GENERIC}
    for rec in _records(stdout):
        reader = readers.get(rec[0]) if rec else None
        if reader is None:
            continue
        try:
            reader(st, rec[1:])
        except (IndexError, KeyError, ValueError):
            continue  # a damaged record: the truncation check below still reports it

    gpus: tuple[GpuRow, ...] = ()
    try:
        gpus = tuple(parse_query_gpu("\n".join(st.gpu_lines), GPU_FIELDS, nounits=True,
                                     header=False))
    except NvsmiParseError as exc:
        st.errors.append(str(exc))
    processes = tuple(replace(p, owner=st.owners.get(p.pid)) for p in _processes(st, gpus))
    signalled = tuple(replace(s, owner=st.owners.get(s.pid)) for s in st.signalled)
    refused = tuple(Refusal(pid, cmd, who, fix, st.owners.get(pid))
                    for pid, (cmd, who, fix) in st.refused.items())

    verified, faults = _verdict(st)

    if not st.began:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        code = "none" if exit_code is None else str(exit_code)
        st.errors.append(f"script produced no records (exit status {code}): "
                         f"{explained(tail)}")
    elif not st.done:
        # What the script's bash said last is often why it stopped.
        last = [line for line in stderr.strip().splitlines() if line.strip()][-1:]
        st.errors.append(_truncated(st) + (f" (stderr: {last[0].strip()})" if last else ""))

    stages = []
    for key, stage in st.stages.items():
        if stage.result is not None:
            stages.append(stage.result)
        elif key != "verify":
            stages.append(StageResult(name=stage.name, type=stage.type, status="failed",
                                      message="interrupted: output ended during this stage",
                                      changes=tuple(stage.changes)))
    error = "; ".join(dict.fromkeys(st.errors)) or None
    return ScriptReport(stages=tuple(stages), gpus=gpus, processes=processes,
                        signalled=signalled, verified=verified, error=error,
                        busy=st.busy, verify_message=st.verify_message,
                        verify_rule=st.verify_rule, faults=tuple(faults),
                        leaks=tuple(sorted(st.bare.items())), xids=_xids(st),
                        left_running=tuple(st.left), resets=tuple(st.resets),
                        stuck=tuple(ProcessRef(pid, cmd) for pid, cmd in st.stuck.items()),
                        owners=dict(st.owners), refused=refused,
                        warnings=tuple(st.warnings), ended=st.done,
                        answered=tuple(st.answered),
                        judged_gpus=None if st.judged_gpus is None else tuple(st.judged_gpus))


def _verdict(st: Readings) -> tuple[bool | None, list[str]]:
    """``verified`` (True: every GPU at or under the threshold; False: one above it at the
    end; None: no verification completed) and the faults the node proved; a failed
    nvidia-smi that proves no fault is an error."""
    faults = pages_faults(st.pages)
    fault = nvsmi_fault(st.nvsmi_exit, st.nvsmi or "") if st.nvsmi_exit is not None else None
    if st.verify == "ok":
        return True, faults
    if st.verify == "dirty":
        return False, faults
    bad = value_faults(st.verify_message) if st.verify == "unknown" else []
    if fault is not None:
        faults.insert(0, fault)  # the tool worked and says a GPU or the driver is broken
    elif bad:
        faults[:0] = bad  # NVML's word for a broken GPU where its memory should be
    elif st.verify in ("error", "unknown"):
        st.errors.append(st.nvsmi or st.verify_message)
    return None, faults


def _xids(st: Readings) -> tuple[Xid, ...]:
    if st.boot_epoch is None:
        return ()
    found = (parse_xid(st.boot_epoch, secs, line) for secs, line in st.xids)
    return tuple(x for x in found if x is not None)


def _truncated(st: Readings) -> str:
    what = "connection lost or script killed"
    if st.current is not None and st.current in st.stages:
        stage = st.stages[st.current]
        if st.current == "verify":
            return f"output ended during verification: {what}"
        return f"output ended during stage {st.current} '{stage.name}' ({stage.type}): {what}"
    return f"output ended before the script finished: {what}"


def _processes(st: Readings, gpus: tuple[GpuRow, ...]) -> tuple[GpuProcess, ...]:
    """One entry per (PID, GPU): nvidia-smi's compute apps first, with the command line and
    user the node read from /proc; device-file holders only where the script named them
    (a GPU no compute app explains)."""
    apps: list[GpuProcess] = []
    for line in st.app_lines:  # one at a time: a line cut by a process's name costs only it
        with contextlib.suppress(NvsmiParseError):
            apps += parse_compute_apps(line, APP_FIELDS, nounits=True)
    uuid_by_index = {g.index: g.uuid for g in gpus}
    cmdlines = {pid: cmdline for pid, _, cmdline, _ in st.holders if cmdline}
    cmdlines.update({pid: cmd for pid, (_, cmd, _, _) in st.procs.items() if cmd})

    def named(p: GpuProcess, *, device_only: bool = False) -> GpuProcess:
        user, _, why, stuck = st.procs.get(p.pid, ("", "", "", ""))
        # Why a device-file holder is not taken for a user of that GPU's memory (a holder
        # record's) speaks of that GPU alone: a job's process that has GPU5's file open
        # and "uses GPU1" is not protected on GPU1.
        held = st.protected.get(p.pid, "") if device_only else ""
        # nvidia-smi names a process by its executable; a person wants the command line.
        # One the node read with none (in its exit, or a zombie whose other threads hold
        # the GPU: verify.sh fc_exit_waits) is named as exiting (reasons._name), not by
        # nvidia-smi's "[Not Found]" for a name it could not read.
        name = cmdlines.get(p.pid, p.name)
        if p.pid in st.procs and p.pid not in cmdlines and name.startswith("["):
            name = ""
        return replace(p, name=name, user=user,
                       protected=why or held, device_only=device_only,
                       stuck=stuck == "stuck", start=st.starts.get(p.pid))

    out = {(a.pid, a.gpu_uuid): named(a) for a in apps}
    for pid, dev, cmdline, index in st.holders:
        uuid = uuid_by_index.get(index, dev) if index is not None else dev
        out.setdefault((pid, uuid), named(GpuProcess(pid=pid, name=cmdline, used_memory_mib=None,
                                                     gpu_uuid=uuid), device_only=True))
    return tuple(out.values())
