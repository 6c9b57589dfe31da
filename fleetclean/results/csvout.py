"""Results -> CSV: one row per host and GPU, for spreadsheets and ``awk -F,``."""

from __future__ import annotations

import csv
import io
from typing import IO

from fleetclean.models import RunResult

CSV_FIELDS = ("host", "status", "index", "uuid", "name", "memory_used_mib", "memory_total_mib")


def write_csv(result: RunResult, out: IO[str]) -> None:
    """One row per host and GPU; a host without GPU rows (failed) gets one row of its own.
    Written at once: a write a row is a system call a row where Python's output is
    unbuffered (PYTHONUNBUFFERED=1)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for h in result.hosts:
        if not h.gpus:
            writer.writerow([h.host, h.status.value, "", "", "", "", ""])
        for g in h.gpus:
            writer.writerow(
                [h.host, h.status.value, g.index, g.uuid, g.name, _num(g.memory_used_mib),
                 _num(g.memory_total_mib)]
            )
    out.write(text.getvalue())


def _num(v: int | None) -> str:
    return "" if v is None else str(v)
