"""The GPU table's grid writes the lines rich's Table would, character for character and
style for style, and leaves to the Table what it cannot write the same (issue #18: 1.3-1.8 s
of rich's layout for a busy fleet's 1,000 rows)."""

from __future__ import annotations

import io
import random

import pytest
from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results import table
from fleetclean.results.grid import Grid

STATUSES = list(HostStatus)


def _styled(console: Console, renderable: object) -> list[tuple[str, str]]:
    """Every character rendered, with the style it is shown in ("" for none)."""
    out = []
    for seg in console.render(renderable, console.options):  # type: ignore[arg-type]
        style = str(seg.style) if seg.style else ""
        out += [(ch, "" if ch == "\n" else style) for ch in seg.text]
    return out


def _result(rng: random.Random, hosts: int) -> RunResult:
    made = []
    for i in range(hosts):
        status = rng.choice(STATUSES)
        gpus: tuple[GpuRow, ...] = ()
        if not status.failed:
            used = [rng.choice([0, 0, 3, 512, 75000, 143771, None]) for _ in range(8)]
            gpus = tuple(GpuRow(index=g, uuid="", name="H100", memory_used_mib=u,
                                memory_total_mib=rng.choice([81559, 0]))
                         for g, u in enumerate(used) if rng.random() > 0.05)
        name = rng.choice(["gpu", "node-", "a", "very-long-host-name-"]) + str(i)
        made.append(HostResult(name, status, "why", gpus=gpus,
                               judged_gpus=rng.choice([None, (0, 1, 2)])))
    return RunResult("status", 1.0, tuple(made))


def _console(color: bool, width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=color,
                   color_system="truecolor" if color else None)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("color", [False, True])
def test_the_grid_is_the_tables_characters_in_the_tables_styles(seed: int, color: bool) -> None:
    rng = random.Random(seed)
    grid = table.gpu_table(_result(rng, rng.randint(0, 30)))
    console = _console(color, 200)
    assert _writes_itself(console, grid)
    assert _styled(console, grid) == _styled(console, grid.table())


def test_a_grid_too_wide_for_the_console_is_laid_out_by_the_table() -> None:
    grid = table.gpu_table(_result(random.Random(7), 12))
    console = _console(False, 40)  # a split pane: the Table wraps and crops its columns
    assert not _writes_itself(console, grid)
    assert _styled(console, grid) == _styled(console, grid.table())
    assert max(len(line) for line in _plain(console, grid).splitlines()) <= 40


def test_a_name_that_is_not_ascii_is_laid_out_by_the_table() -> None:
    grid = Grid([("HOST", "left"), ("GPU0", "right")],
                [[Text("gpu-北京-01"), Text("0", style="green")], [Text("x"), Text("512")]])
    console = _console(True, 80)
    assert not _writes_itself(console, grid)
    assert _styled(console, grid) == _styled(console, grid.table())
    assert "gpu-北京-01" in _plain(console, grid)


def test_a_thousand_rows_read_as_the_tables_and_the_styles_stay_the_themes() -> None:
    result = _result(random.Random(1), 1000)
    console = _console(True, 120)
    grid = table.gpu_table(result)
    assert _writes_itself(console, grid)
    assert _styled(console, grid) == _styled(console, grid.table())
    styles = {style for _, style in _styled(console, grid)}
    assert {str(Style.parse("bold")), "green", "red", "dim"} <= styles


def _plain(console: Console, renderable: object) -> str:
    return "".join(ch for ch, _ in _styled(console, renderable))


def _writes_itself(console: Console, grid: Grid) -> bool:
    return not any(isinstance(x, Table) for x in grid.__rich_console__(console, console.options))


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_an_output_that_cannot_write_the_rule_gets_the_tables_ascii_box(encoding: str) -> None:
    # A pipe under LC_ALL=C with PYTHONUTF8=0, or PYTHONIOENCODING=latin-1: "─" would not
    # encode, and the run would end in an internal error instead of its table.
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding)
    console = Console(file=out, width=100)
    grid = table.gpu_table(_result(random.Random(3), 5))
    assert not _writes_itself(console, grid)
    console.print(grid)
    out.flush()
    assert "-+-" in raw.getvalue().decode(encoding)


def test_cells_the_table_would_lay_out_otherwise_go_to_the_table() -> None:
    console = _console(True, 80)
    for rows in ([[Text("a"), Text("5 ")]],  # right-justified, ending in a space
                 [[Text("a"), Text("5", justify="left")]],  # a justification of its own
                 [[Text("a")]]):  # a row shorter than the header
        grid = Grid([("HOST", "left"), ("GPU0", "right")], rows)
        assert not _writes_itself(console, grid)
        assert _styled(console, grid) == _styled(console, grid.table())
    grid = Grid([("HOST", "left")], [[Text("a", style="no-such-style")]])
    assert _writes_itself(console, grid)
    assert _styled(console, grid) == _styled(console, grid.table())
