"""What the final table costs at 1,000 hosts: the grid's own lines against rich's Table.

Run: ``.venv/bin/python benchmarks/table.py [--hosts 1000] [--reps 7]``. Builds a run's
result as a busy fleet's status gives it (every host dirty, eight GPUs of memory each, a
third of the hosts unreachable: nothing folds), then renders the whole output
(``table.print_result``: the per-state lines, the table, the problem lines, the summary) to
a colour terminal of 120 columns, in alternating repetitions, once with the table as the
grid writes it (``results/grid.py``) and once with the same cells laid out by rich's
``Table`` (``Grid.table``), the layout before the grid. Prints the CPU time of each
(min/median/max) and the ratio of the medians; the output of the two is checked the same,
character for character.
"""

from __future__ import annotations

import argparse
import io
import random
import re
import statistics
import time
from collections.abc import Iterator

from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.table import Table

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results import grid, table


def busy_fleet(hosts: int) -> RunResult:
    rng = random.Random(18)
    made = []
    for i in range(hosts):
        name = f"gpu{i:04d}"
        if i % 3 == 0:
            made.append(HostResult(name, HostStatus.UNREACHABLE,
                                   f"cannot connect to 10.1.{i // 250}.{i % 250}:22: "
                                   "connection refused"))
            continue
        gpus = tuple(GpuRow(index=g, uuid=f"GPU-{i}-{g}", name="NVIDIA H100 80GB HBM3",
                            memory_used_mib=rng.randint(70_000, 79_000),
                            memory_total_mib=81_559) for g in range(8))
        made.append(HostResult(name, HostStatus.DIRTY, "GPU memory in use", gpus=gpus))
    return RunResult("status", 30.0, tuple(made))


def render(result: RunResult) -> tuple[float, str]:
    """CPU seconds of the whole output, and the output."""
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system="truecolor")
    started = time.process_time()
    table.print_result(console, result)
    return time.process_time() - started, out.getvalue()


_OWN = grid.Grid.__rich_console__


def _as_table(self: grid.Grid, console: Console,
              options: ConsoleOptions) -> Iterator[Table | Segment]:
    yield self.table()


def use(kind: str) -> None:
    """Every Grid renders as itself ("grid") or as its Table ("rich Table")."""
    grid.Grid.__rich_console__ = _OWN if kind == "grid" else _as_table  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    result = busy_fleet(args.hosts)
    kinds = ("grid", "rich Table")
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    outputs: dict[str, str] = {}
    try:
        for rep in range(args.reps):
            for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
                use(kind)
                took, outputs[kind] = render(result)
                cpu[kind].append(took)
    finally:  # the grid renders as itself again, whatever a render raised
        use("grid")
    same = _plain(outputs["grid"]) == _plain(outputs["rich Table"])
    print(f"{args.hosts} hosts, {sum(not h.status.failed for h in result.hosts)} dirty rows "
          f"and {sum(h.status.failed for h in result.hosts)} failed, {args.reps} repetitions; "
          f"the same characters: {same}")
    for kind, xs in cpu.items():
        print(f"  {kind:11} CPU {min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f} s")
    ratio = statistics.median(cpu["grid"]) / statistics.median(cpu["rich Table"])
    print(f"  grid / rich Table: {ratio:.3f}x")
    return 0 if same else 1


def _plain(text: str) -> str:
    """The characters of a terminal's output, its colour codes left out."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


if __name__ == "__main__":
    raise SystemExit(main())
