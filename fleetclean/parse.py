"""Script output -> :class:`ScriptReport`. Pure; needs no SSH to be tested.

Wire format (written by ``stages/lib.sh``): one record per stdout line,
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
done       0                             (the script reached its end)
=========  ==========================================================================

>>> r = parse_script_output("@@fleetclean\\tbegin\\t1\\tp\\th\\t0\\n"
...                         "@@fleetclean\\tstage\\t1\\tstop\\tsignal\\n", "", None)
>>> r.error
"output ended during stage 1 'stop' (signal): connection lost or script killed"
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from urllib.parse import unquote

from fleetclean.models import GpuProcess, GpuRow, ScriptReport, Signalled, StageResult
from fleetclean.nvsmi import (
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


@dataclass
class _Stage:
    name: str
    type: str
    changes: list[str] = field(default_factory=list)
    result: StageResult | None = None


@dataclass
class _State:
    began: bool = False
    done: bool = False
    busy: bool = False
    stages: dict[str, _Stage] = field(default_factory=dict)
    current: str | None = None
    signalled: list[Signalled] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    gpu_lines: list[str] = field(default_factory=list)
    app_lines: list[str] = field(default_factory=list)
    holders: list[tuple[int, str, str]] = field(default_factory=list)
    verify: str | None = None
    verify_message: str = ""
    nvsmi: str | None = None


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


def _apply(st: _State, kind: str, a: list[str]) -> None:
    if kind == "begin":
        st.began = True
    elif kind == "lock" and a[0] == "busy":
        st.busy = True
    elif kind == "stage":
        st.stages[a[0]] = _Stage(name=a[1], type=a[2])
        st.current = a[0]
    elif kind == "signal":
        stage = st.stages.get(a[0])
        st.signalled.append(Signalled(pid=int(a[1]), cmdline=a[3], signal=a[2],
                                      stage=stage.name if stage else ""))
    elif kind == "change":
        st.stages[a[0]].changes.append(a[1])
    elif kind == "end":
        stage = st.stages[a[0]]
        stage.result = StageResult(
            name=stage.name, type=stage.type, status=a[1], matched=int(a[2]),
            signalled=int(a[3]), remaining=int(a[4]), duration_s=int(a[5]) / 1000,
            message=a[6], changes=tuple(stage.changes))
        st.current = None
        if a[1] == "failed":
            st.errors.append(f"stage '{stage.name}' failed: {a[6]}")
    elif kind == "error":
        st.errors.append(a[0])
    elif kind == "nvsmi":
        text = a[1].strip() or "(no output)"
        st.nvsmi = (text if a[0] == "127" else f"nvidia-smi failed (exit {a[0]}): {text}")
    elif kind == "gpu":
        st.gpu_lines.append(a[0])
    elif kind == "app":
        st.app_lines.append(a[0])
    elif kind == "holder":
        st.holders.append((int(a[0]), a[1], a[2]))
    elif kind == "verify":
        st.verify, st.verify_message = a[0], a[3]
        st.current = None
    elif kind == "done":
        st.done = True


def parse_script_output(stdout: str, stderr: str, exit_code: int | None) -> ScriptReport:
    """Turn one host's script output into a report; never raises on odd output.

    ``verified`` is True when every GPU ended at or under the threshold, False when the
    deadline passed with one above it, None when no verification completed. ``error``
    names the first host-level problem a person must act on.
    """
    st = _State()
    for rec in _records(stdout):
        if not rec:
            continue
        try:
            _apply(st, rec[0], rec[1:])
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
                        busy=st.busy, verify_message=st.verify_message)


def _truncated(st: _State) -> str:
    what = "connection lost or script killed"
    if st.current is not None and st.current in st.stages:
        stage = st.stages[st.current]
        if st.current == "verify":
            return f"output ended during verification: {what}"
        return f"output ended during stage {st.current} '{stage.name}' ({stage.type}): {what}"
    return f"output ended before the script finished: {what}"


def _processes(st: _State, gpus: tuple[GpuRow, ...]) -> tuple[GpuProcess, ...]:
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
