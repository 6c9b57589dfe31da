"""The GPU table's grid of cells: written a line at a time where rich's ``Table`` would lay
it out to the same lines, and given to that ``Table`` everywhere else.

rich's ``Table`` measures and renders every cell through its general layout (wrapping,
cropping, padding and alignment objects for each one): 1.3-2.0 ms of CPU a row of ten cells
on this machine, so 1.3-2.0 s for the 1,000 rows of a busy fleet's status, all of it after
the last host has answered, and again at each refresh of a ``status --watch``. rich's author
on a large table: "never going to be *fast*" (https://github.com/Textualize/rich/issues/1069).
The table here is the simple case of that layout: every cell one line of printable ASCII
(host names come escaped, ``words.printable``), and where the whole fits the console's width
and its encoding draws the rule, nothing is wrapped, cropped or drawn otherwise. The
``Table`` (``SIMPLE_HEAD``, no edge, one space of padding each side, collapsed) then gives
each column its widest cell's width, the first column its left padding, each cell its right
padding, a space between columns, the header's cells (padding included) the header style, a
rule of ``─`` across under the header, and each cell's text justified in its width in that
text's style. ``Grid`` writes those segments itself where that case holds, and renders its
``Table`` where it does not: a narrow terminal, a name with a character that is not ASCII,
an output that is not UTF-8. ``tests/unit/test_grid.py`` holds the two to the same
characters in the same styles.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from rich import box
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right"]


class Grid:
    """A table of one-line cells: a header (plain text, no markup) and justification per
    column, and rows of ``Text``, each cell's style its text's own (``Text(value,
    style=...)``)."""

    def __init__(self, columns: Sequence[tuple[str, Justify]],
                 rows: Sequence[Sequence[Text]]) -> None:
        self.columns = list(columns)
        self.rows = rows

    def table(self) -> Table:
        """The same cells as rich's ``Table``: what the grid looks like, and what renders
        it where the grid's own lines would not be the same."""
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False,
                      collapse_padding=True)
        for i, (name, justify) in enumerate(self.columns):
            # The first and last columns (the host, its status) never wrap.
            ends = i in (0, len(self.columns) - 1)
            table.add_column(name, justify=justify, no_wrap=ends)
        for row in self.rows:
            table.add_row(*row)
        return table

    def _widths(self) -> list[int] | None:
        """Each column's width, or None where the Table would not lay a cell out as written:
        a row of another length, a cell that is not one line of printable ASCII, one with
        spans or a justification of its own, a right-justified one ending in a space (the
        Table strips it)."""
        widths = [len(name) for name, _ in self.columns]
        for row in self.rows:
            if len(row) != len(widths):
                return None
            for i, cell in enumerate(row):
                text = cell.plain
                if not (text.isascii() and text.isprintable()) or cell.spans or cell.justify:
                    return None
                if self.columns[i][1] == "right" and text.endswith(" "):
                    return None
                widths[i] = max(widths[i], len(text))
        return widths

    def __rich_console__(self, console: Console,
                         options: ConsoleOptions) -> Iterator[Table | Segment]:
        widths = self._widths()
        # The first column's left padding, then each column and its right padding, and a
        # space between columns.
        total = 1 + sum(w + 1 for w in widths or ()) + max(len(self.columns) - 1, 0)
        # An output that cannot write the rule's "─" (ASCII, Latin-1: a pipe under LC_ALL=C
        # with PYTHONIOENCODING or PYTHONUTF8=0) gets the Table's ASCII box.
        drawn = box.SIMPLE_HEAD.substitute(options, safe=console.safe_box) is box.SIMPLE_HEAD
        if widths is None or total > options.max_width or not drawn:
            yield self.table()
            return
        header = console.get_style("table.header")
        plain = Style()
        sep = Segment(" ", plain)
        for i, ((name, justify), width) in enumerate(zip(self.columns, widths, strict=True)):
            if i:
                yield sep
            yield Segment(f"{' ' if i == 0 else ''}{_fit(name, width, justify)} ", header)
        yield Segment.line()
        yield Segment("─" * total, plain)
        yield Segment.line()
        for row in self.rows:
            yield sep
            for i, (cell, width, (_, justify)) in enumerate(
                    zip(row, widths, self.columns, strict=True)):
                if i:
                    yield Segment("  ", plain)
                yield Segment(_fit(cell.plain, width, justify), _style(console, cell))
            yield sep
            yield Segment.line()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table())


def _fit(text: str, width: int, justify: Justify) -> str:
    return text.rjust(width) if justify == "right" else text.ljust(width)


def _style(console: Console, cell: Text) -> Style | None:
    """A cell's style as the ``Table`` renders it: a named style looked up in the console's
    theme; none where the text has none (rich's own ``None``)."""
    if not cell.style:
        return None
    if isinstance(cell.style, str):  # a name the theme lacks is no style, as in the Table
        return console.get_style(cell.style, default=Style.null())
    return cell.style
