"""Pure parsers for nvidia-smi's CSV output (``--query-gpu``, ``--query-compute-apps``).

Keyed by nvidia-smi's own field names; a value nvidia-smi could not give (``[N/A]``,
``[Not Supported]``) becomes ``None`` so one broken field never hides the rest.

>>> parse_query_gpu("0, GPU-fa52, NVIDIA H200, 0, 143771",
...                 ["index", "uuid", "name", "memory.used", "memory.total"],
...                 nounits=True, header=False)
[GpuRow(index=0, uuid='GPU-fa52', name='NVIDIA H200', memory_used_mib=0, memory_total_mib=143771)]
>>> parse_query_gpu("Failed to initialize NVML: Driver/library version mismatch",
...                 ["index", "memory.used"], nounits=True, header=False)
Traceback (most recent call last):
fleetclean.results.nvsmi.NvsmiParseError: nvidia-smi: Failed to initialize NVML: ...
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fleetclean.models import GpuProcess, GpuRow

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total")
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
_UNIT = re.compile(r"^\s*(\S+)\s+(MiB|KiB|GiB|%|W|C)\s*$")


class NvsmiParseError(ValueError):
    """Output that is not the CSV asked for; the message is nvidia-smi's own text."""


def _missing(text: str) -> bool:
    t = text.strip()
    return not t or (t.startswith("[") and t.endswith("]")) or t in ("N/A", "Unknown")


def _number(text: str, *, nounits: bool) -> int | None:
    if _missing(text):
        return None
    value = text.strip()
    if not nounits:
        m = _UNIT.match(value)
        if m:
            value = m.group(1)
    try:
        return int(value)
    except ValueError:
        try:
            return int(float(value))
        except ValueError:
            return None


def _split(line: str, fields: Sequence[str], free: str) -> dict[str, str]:
    """Split on ', '; surplus parts belong to the free-text field (names may hold commas)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < len(fields):
        raise NvsmiParseError(f"nvidia-smi: {line.strip()}")
    if len(parts) > len(fields) and free in fields:
        i = list(fields).index(free)
        extra = len(parts) - len(fields)
        parts[i:i + extra + 1] = [", ".join(parts[i:i + extra + 1])]
    if len(parts) != len(fields):
        raise NvsmiParseError(f"nvidia-smi: {line.strip()}")
    return dict(zip(fields, parts, strict=True))


def _lines(text: str, header: bool) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[1:] if header and lines else lines


def parse_query_gpu(text: str, fields: Sequence[str], *, nounits: bool,
                    header: bool) -> list[GpuRow]:
    """Rows of ``--query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    Raises :class:`NvsmiParseError` with nvidia-smi's message when a line is not a row
    (``Failed to initialize NVML ...``, ``No devices were found``).
    """
    rows = []
    for line in _lines(text, header):
        values = _split(line, fields, "name")
        index = _number(values.get("index", ""), nounits=True)
        if index is None:
            raise NvsmiParseError(f"nvidia-smi: {line.strip()}")
        rows.append(GpuRow(
            index=index,
            uuid=values.get("uuid", ""),
            name=values.get("name", ""),
            memory_used_mib=_number(values.get("memory.used", ""), nounits=nounits),
            memory_total_mib=_number(values.get("memory.total", ""), nounits=nounits),
        ))
    return rows


def parse_compute_apps(text: str, fields: Sequence[str] = APP_FIELDS, *, nounits: bool = True,
                       header: bool = False) -> list[GpuProcess]:
    """Rows of ``--query-compute-apps=<fields> --format=csv,noheader[,nounits]``.

    >>> parse_compute_apps("6742, python3, 41478 MiB, GPU-fa52, 00000000:00:06.0",
    ...                    [*APP_FIELDS, "gpu_bus_id"], nounits=False)
    ... # doctest: +ELLIPSIS
    [GpuProcess(pid=6742, name='python3', used_memory_mib=41478, gpu_uuid='GPU-fa52', ...)]
    """
    apps = []
    for line in _lines(text, header):
        values = _split(line, fields, "process_name")
        pid = _number(values.get("pid", ""), nounits=True)
        if pid is None:
            raise NvsmiParseError(f"nvidia-smi: {line.strip()}")
        apps.append(GpuProcess(
            pid=pid,
            name=values.get("process_name", ""),
            used_memory_mib=_number(values.get("used_memory", ""), nounits=nounits),
            gpu_uuid=values.get("gpu_uuid", ""),
        ))
    return apps
