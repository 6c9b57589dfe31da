"""Results -> the fleet GPU table, JSON, CSV, live progress. Given a console; never decides.

The table has one row per host and one column per GPU; hosts with identical clean rows fold
into one node set (``node[01-14]``), failed hosts get a one-line reason, and identical reasons
are shown once for all the hosts that gave them.
"""

from __future__ import annotations

import csv
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.nodeset import fold

if TYPE_CHECKING:
    from fleetclean.fleet import Event

_STATUS_STYLE = {
    HostStatus.CLEAN: "green",
    HostStatus.DIRTY: "yellow",
}


def to_json(result: RunResult) -> dict[str, Any]:
    """The --json object of DESIGN.md's contract (extra keys only where it allows)."""
    return {
        "playbook": result.playbook,
        "duration_s": result.duration_s,
        "summary": summary(result),
        "hosts": [host_json(h) for h in result.hosts],
    }


def summary(result: RunResult) -> dict[str, int]:
    """Counts of hosts by outcome, as in --json's ``summary``."""
    hosts = result.hosts
    return {
        "hosts": len(hosts),
        "clean": sum(h.status is HostStatus.CLEAN for h in hosts),
        "dirty": sum(h.status is HostStatus.DIRTY for h in hosts),
        "failed": sum(h.status.failed for h in hosts),
    }


def host_json(h: HostResult) -> dict[str, Any]:
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
            }
            for g in h.gpus
        ],
        "signalled": [
            {"pid": s.pid, "cmdline": s.cmdline, "signal": s.signal} for s in h.signalled
        ],
    }


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


def _cell(g: GpuRow | None) -> Text:
    if g is None:
        return Text("-", style="dim")
    used = g.memory_used_mib
    if used is None:
        return Text("N/A", style="magenta")
    total = g.memory_total_mib or 0
    share = used / total if total else (1.0 if used else 0.0)
    style = "green" if used == 0 else "yellow" if share < 0.05 else "red"
    return Text(str(used), style=style)


def _fold_key(h: HostResult) -> tuple[Any, ...] | None:
    if h.status is not HostStatus.CLEAN:
        return None
    return tuple((g.index, g.memory_used_mib) for g in h.gpus)


def gpu_table(result: RunResult) -> Table:
    ncols = max((g.index + 1 for h in result.hosts for g in h.gpus), default=8)
    # Narrow on purpose: a host, 8 GPU columns of up to 6 digits and the status fit 80
    # columns, the width of the terminal an engineer ssh'd in from.
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False, collapse_padding=True)
    table.add_column("HOST", no_wrap=True)
    for i in range(ncols):
        table.add_column(f"GPU{i}", justify="right")
    table.add_column("STATUS", no_wrap=True)
    # Fold hosts whose rows are identical and clean, in the order each group first appears.
    folded: dict[tuple[Any, ...], list[HostResult]] = {}
    rows: list[tuple[str, HostResult]] = []
    for h in result.hosts:
        key = _fold_key(h)
        if key is None:
            rows.append((h.host, h))
            continue
        if key not in folded:
            folded[key] = []
            rows.append(("", h))
        folded[key].append(h)
    for name, h in rows:
        label = name or fold(x.host for x in folded[_fold_key(h) or ()])
        by_index = {g.index: g for g in h.gpus}
        cells = [_cell(by_index.get(i)) for i in range(ncols)]
        status = Text(h.status.value, style=_STATUS_STYLE.get(h.status, "bold red"))
        table.add_row(Text(label), *cells, status)
    return table


def problems(result: RunResult) -> list[str]:
    """One line per distinct problem, naming every host that had it."""
    by_message: dict[tuple[str, str], list[str]] = defaultdict(list)
    for h in result.hosts:
        if h.status is HostStatus.CLEAN:
            continue
        by_message[(h.status.value, h.error or "")].append(h.host)
    return [f"{fold(hosts)}: {status}: {msg}" for (status, msg), hosts in by_message.items()]


def check_blocks(result: RunResult) -> list[tuple[str, list[str]]]:
    """What --check found, one block per distinct list of changes, naming every host that
    gave it (as dshbak -c does); hosts with nothing to change are left out."""
    blocks: dict[tuple[str, ...], list[str]] = {}
    for h in result.hosts:
        lines = tuple(f"{s.name}: {c}" for s in h.stages for c in s.changes)
        if lines:
            blocks.setdefault(lines, []).append(h.host)
    return [(fold(hosts), list(lines)) for lines, hosts in blocks.items()]


def print_check(console: Console, result: RunResult) -> None:
    console.print("--check: nothing was changed. What each stage would do:", style="bold")
    blocks = check_blocks(result)
    if not blocks:
        checked = [h for h in result.hosts if not h.status.failed]
        text = ("nothing: every host that answered has nothing to stop, restore or remove"
                if checked else "nothing: no host could be checked (see above)")
        console.print(f"  {text}", markup=False)
    for hosts, lines in blocks:
        console.print(f"{hosts}:", style="bold", markup=False)
        for line in lines:
            console.print(f"  {line}", markup=False, no_wrap=True, overflow="ellipsis")


def summary_line(result: RunResult) -> str:
    s = summary(result)
    line = (
        f"{s['hosts']} hosts: {s['clean']} clean, {s['dirty']} dirty, {s['failed']} failed "
        f"in {result.duration_s:.2f}s"
    )
    signalled = sum(len(h.signalled) for h in result.hosts)
    if signalled:
        line += f"; {signalled} signals sent"
    if result.interrupted:
        line += " (interrupted)"
    return line


def render_result(result: RunResult) -> RenderableType:
    # The title is a line of its own: as a table title it would wrap to the table's width.
    title = Text(f"GPU memory used (MiB), {result.playbook}", style="bold")
    parts: list[RenderableType] = [title, gpu_table(result)]
    for line in problems(result):
        parts.append(Text(line, style="yellow"))
    parts.append(Text(summary_line(result), style="bold"))
    return Group(*parts)


def print_result(console: Console, result: RunResult) -> None:
    console.print(render_result(result))


class LiveProgress:
    """Live view while a run goes on: a line per host for small fleets, a bar beyond.

    Used as the fleet's event callback (thread-safe). Shows nothing when the console is
    not a terminal.
    """

    LINES_UP_TO = 16

    def __init__(self, console: Console, hosts: Iterable[str]) -> None:
        self._console = console
        self._hosts = list(hosts)
        self._state: dict[str, str] = {h: "waiting" for h in self._hosts}
        self._lock = threading.Lock()
        self._enabled = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("hosts", total=len(self._hosts))
        self._live = Live(console=console, refresh_per_second=8, transient=True)

    def __enter__(self) -> LiveProgress:
        if self._enabled:
            self._live.start()
            self._live.update(self._render())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            self._live.stop()

    def __call__(self, event: Event) -> None:
        with self._lock:
            if event.kind == "start":
                self._state[event.host] = "connecting"
            elif event.kind == "stage":
                self._state[event.host] = event.stage
            elif event.kind == "done" and event.result is not None:
                self._state[event.host] = event.result.status.value
                self._progress.advance(self._task)
            if self._enabled:
                self._live.update(self._render())

    def _render(self) -> RenderableType:
        counts: dict[str, int] = defaultdict(int)
        for state in self._state.values():
            counts[state] += 1
        desc = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        self._progress.update(self._task, description=desc)
        if len(self._hosts) > self.LINES_UP_TO:
            return self._progress
        lines = [Text.assemble((f"{h:<20}", "bold"), " ", self._state[h]) for h in self._hosts]
        return Group(*lines, self._progress)
