"""Script output -> :class:`ScriptReport`. Pure; needs no SSH to be tested.

Wire format (written by ``engine/stages/lib.sh``): one record per stdout line,
``@@fleetclean`` TAB kind TAB field..., each field percent-encoded (``%`` ``\\t`` ``\\n``
``\\r`` as ``%25 %09 %0A %0D``), so a command line or message holding tabs or newlines
cannot break the framing. Any other line (stray output, a banner) is ignored. Kinds:

=========  ==========================================================================
begin      version, playbook, host, check (0/1)
lock       ok | busy | none, lock path
stage      index, name, type             (a stage starts; "verify" for the verification)
match      index, pid, cmdline           (a process the stage targets)
signal     index, pid, TERM|KILL|..., cmdline
change     index, text                   (what was or would be changed)
end        index, status, matched, signalled, remaining, milliseconds, message
error      message                       (host-level: busy, guard refusal)
nvsmi      exit status, nvidia-smi's own output
gpu        one --query-gpu CSV line (index, uuid, name, memory.used, memory.total)
app        one --query-compute-apps CSV line (pid, process_name, used_memory, gpu_uuid)
holder     pid, device file, cmdline     (a process with /dev/nvidiaN open)
verify     ok | dirty | unknown | error | skipped, max_used_mib, milliseconds, message
scope      user, uid, job, GPUs judged, how they were given ("" | list | slurm)
done       0                             (the script reached its end)
clock      start µs, end µs, exit status (a standalone script's: fleetclean report)
=========  ==========================================================================

The parser reads the generic kinds (begin, lock, stage, match, signal, change, end,
error, done) itself; every other kind belongs to one stage type (the verification's
``nvsmi``, ``gpu``, ``app``, ``holder``, ``verify``) and is read by the reader that type
registers (:func:`fleetclean.engine.stages.record_readers`). An unknown kind is ignored.

>>> r = parse_script_output("@@fleetclean\\tbegin\\t1\\tp\\th\\t0\\n"
...                         "@@fleetclean\\tstage\\t1\\tstop\\tsignal\\n", "", None)
>>> r.error
"output ended during stage 1 'stop' (signal): connection lost or script killed"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from urllib.parse import unquote

from fleetclean.engine.stages import record_readers
from fleetclean.engine.stages.base import Readings, StageReading
from fleetclean.models import GpuProcess, GpuRow, ScriptReport, Signalled, StageResult
from fleetclean.results.nvsmi import (
    APP_FIELDS,
    GPU_FIELDS,
    NvsmiParseError,
    parse_compute_apps,
    parse_query_gpu,
)

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
    for raw in stdout.splitlines():
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
                                  stage=stage.name if stage else ""))


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


def _scope(st: Readings, a: list[str]) -> None:
    """Only the GPUs of a --gpus or epilog scope are judged; the others are shown."""
    if a[4]:
        st.judged_gpus = [int(i) for i in a[3].split(",") if i.isdigit()]


_GENERIC: dict[str, Callable[[Readings, list[str]], None]] = {
    "begin": _begin, "lock": _lock, "stage": _stage, "match": _match, "signal": _signal,
    "change": _change, "end": _end, "error": _error, "done": _done, "scope": _scope,
    "clock": _clock,
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
    processes = _processes(st, gpus)

    verified: bool | None = None
    if st.verify == "ok":
        verified = True
    elif st.verify == "dirty":
        verified = False
    elif st.verify in ("error", "unknown"):
        st.errors.append(st.nvsmi or st.verify_message)

    if not st.began:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        code = "none" if exit_code is None else str(exit_code)
        st.errors.append(f"script produced no records (exit status {code}): {tail}")
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
                        signalled=tuple(st.signalled), verified=verified, error=error,
                        busy=st.busy, verify_message=st.verify_message,
                        judged_gpus=None if st.judged_gpus is None else tuple(st.judged_gpus))


def _truncated(st: Readings) -> str:
    what = "connection lost or script killed"
    if st.current is not None and st.current in st.stages:
        stage = st.stages[st.current]
        if st.current == "verify":
            return f"output ended during verification: {what}"
        return f"output ended during stage {st.current} '{stage.name}' ({stage.type}): {what}"
    return f"output ended before the script finished: {what}"


def _processes(st: Readings, gpus: tuple[GpuRow, ...]) -> tuple[GpuProcess, ...]:
    try:
        apps = parse_compute_apps("\n".join(st.app_lines), APP_FIELDS, nounits=True)
    except NvsmiParseError:
        apps = []
    uuid_by_dev = {f"/dev/nvidia{g.index}": g.uuid for g in gpus}
    cmdlines = {pid: cmdline for pid, _, cmdline in st.holders if cmdline}
    # nvidia-smi names a process by its executable; a person wants the command line.
    out = {(a.pid, a.gpu_uuid): replace(a, name=cmdlines.get(a.pid, a.name)) for a in apps}
    for pid, dev, cmdline in st.holders:
        uuid = uuid_by_dev.get(dev, dev)
        out.setdefault((pid, uuid), GpuProcess(pid=pid, name=cmdline, used_memory_mib=None,
                                               gpu_uuid=uuid))
    return tuple(out.values())
