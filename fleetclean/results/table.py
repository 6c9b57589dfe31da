"""Results -> the fleet GPU table, problem lines, --check blocks and the summary line.

Given a console; never decides. The table has one row per host and one column per GPU;
hosts with identical clean rows fold into one node set (``node[01-14]``), failed hosts get a
one-line reason, and identical reasons are shown once for all the hosts that gave them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.nodeset import fold
from fleetclean.results.jsonio import summary
from fleetclean.results.words import counted

_STATUS_STYLE = {
    HostStatus.CLEAN: "green",
    HostStatus.DIRTY: "yellow",
    HostStatus.FAULTY: "bold magenta",  # hardware: no kill helps, unlike dirty
}


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
            if console.is_terminal:
                console.print(f"  {line}", markup=False, no_wrap=True, overflow="ellipsis")
            else:  # a log keeps the whole command line
                console.print(f"  {line}", markup=False, soft_wrap=True)


def summary_line(result: RunResult) -> str:
    """The run in one line.

    >>> from fleetclean.models import HostResult, HostStatus, Signalled
    >>> host = HostResult("gpu01", HostStatus.CLEAN, signalled=(Signalled(7, "x", "TERM"),))
    >>> summary_line(RunResult("status", 0.25, (host,)))
    '1 host: 1 clean, 0 dirty, 0 failed in 0.25s; 1 signal sent'
    """
    s = summary(result)
    faulty = f"{s['faulty']} faulty, " if s["faulty"] else ""
    line = (
        f"{counted(s['hosts'], 'host')}: {s['clean']} clean, {s['dirty']} dirty, {faulty}"
        f"{s['failed']} failed in {result.duration_s:.2f}s"
    )
    signalled = sum(len(h.signalled) for h in result.hosts)
    if signalled:
        line += f"; {counted(signalled, 'signal')} sent"
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
