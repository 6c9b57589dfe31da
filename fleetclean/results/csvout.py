"""Results -> CSV: one row per host and GPU, for spreadsheets and ``awk -F,``."""

from __future__ import annotations

import csv
from typing import IO

from fleetclean.models import RunResult

CSV_FIELDS = ("host", "status", "index", "uuid", "name", "memory_used_mib", "memory_total_mib")


def write_csv(result: RunResult, out: IO[str]) -> None:
    """One row per host and GPU; a host without GPU rows (failed) gets one row of its own."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for h in result.hosts:
        if not h.gpus:
            writer.writerow([h.host, h.status.value, "", "", "", "", ""])
        for g in h.gpus:
            writer.writerow(
                [h.host, h.status.value, g.index, g.uuid, g.name, _num(g.memory_used_mib),
                 _num(g.memory_total_mib)]
            )


def _num(v: int | None) -> str:
    return "" if v is None else str(v)
