r"""Results -> Prometheus text format, for node_exporter's textfile collector or a Pushgateway.

One series per host and GPU for memory, one per host and *known* status (1 for the host's
status, 0 for the others, so that ``fleetclean_host_status{status="dirty"} == 1`` alerts and
a recovered host reads 0 instead of vanishing), one per host for its duration, and the
run's timestamp. A GPU field nvidia-smi could not give ([N/A]) has no sample.

>>> from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
>>> gpu = GpuRow(0, "GPU-0", "NVIDIA H200", 512, 143771)
>>> text = render(RunResult("status", 1.5, (HostResult('gpu"01', HostStatus.DIRTY, None, 1.25,
...                                                    gpus=(gpu,)),)), now=1700000000.0)
>>> print("\n".join(line for line in text.splitlines() if "used" in line))
# HELP fleetclean_gpu_memory_used_mib GPU memory in use at the end of the run, per nvidia-smi.
# TYPE fleetclean_gpu_memory_used_mib gauge
fleetclean_gpu_memory_used_mib{host="gpu\"01",gpu="0"} 512
>>> 'fleetclean_host_status{host="gpu\\"01",status="dirty"} 1' in text
True
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from fleetclean.models import HostStatus, RunResult

_Sample = tuple[dict[str, str], float]

_HELP = {
    "fleetclean_gpu_memory_used_mib":
        "GPU memory in use at the end of the run, per nvidia-smi.",
    "fleetclean_gpu_memory_total_mib": "GPU memory in total, as nvidia-smi reported it.",
    "fleetclean_host_status":
        "1 for the host's outcome of the last run (clean, dirty, faulty, unreachable, ...), "
        "0 for the other outcomes.",
    "fleetclean_host_duration_seconds": "Seconds the last run took on the host.",
    "fleetclean_run_timestamp_seconds": "Unix time the last run ended.",
}


def escape(value: str) -> str:
    r"""A label value as the text format wants it: ``\``, ``"`` and newlines escaped.

    >>> print(escape('a"b\\c\nd'))
    a\"b\\c\nd
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) and not v.is_integer() else str(int(v))


def _family(name: str, samples: Iterable[_Sample]) -> list[str]:
    lines = [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        body = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}")
    return lines


def render(result: RunResult, *, now: float) -> str:
    """The whole exposition, ending in a newline as the format requires."""
    used: list[_Sample] = []
    total: list[_Sample] = []
    for h in result.hosts:
        for g in h.gpus:
            labels = {"host": h.host, "gpu": str(g.index)}
            if g.memory_used_mib is not None:
                used.append((labels, g.memory_used_mib))
            if g.memory_total_mib is not None:
                total.append((labels, g.memory_total_mib))
    status = [({"host": h.host, "status": s.value}, float(h.status is s))
              for h in result.hosts for s in HostStatus]
    duration = [({"host": h.host}, h.duration_s) for h in result.hosts]
    lines = [
        *_family("fleetclean_gpu_memory_used_mib", used),
        *_family("fleetclean_gpu_memory_total_mib", total),
        *_family("fleetclean_host_status", status),
        *_family("fleetclean_host_duration_seconds", duration),
        *_family("fleetclean_run_timestamp_seconds", [({}, now)]),
    ]
    return "\n".join(lines) + "\n"


def write(result: RunResult, path: str | os.PathLike[str], *, now: float) -> None:
    """Write atomically: a temp file in the same directory, then rename, so the textfile
    collector never reads half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(render(result, now=now))
        # mkstemp makes the file 0600; the collector often runs as another user.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
