"""Counted nouns for every user-facing line: "1 host", "2 hosts", never "1 hosts".

>>> counted(1, "host"), counted(14, "host"), counted(0, "signal")
('1 host', '14 hosts', '0 signals')
>>> counted(1, "process", "processes"), counted(3, "process", "processes")
('1 process', '3 processes')
"""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """``word`` for one, else ``many`` (``word + "s"`` unless given)."""
    return word if n == 1 else (many or word + "s")


def counted(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {plural(n, word, many)}"


# Every control character (C0, DEL, C1) as an escape, but for the three with a name.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"})


def printable(text: str) -> str:
    """``text`` with its control characters written out as escapes, for a terminal: what a
    host sends (a process's command line or name, a unit's, a kernel log line) is anyone's
    there, and a process named with an escape sequence (``ESC ]0;...`` retitles the
    terminal, ``ESC [2J`` clears it) or a newline (a table line cut in two) would otherwise
    reach the terminal of whoever runs fleetclean. rich drops only BEL, BS, VT, FF and CR
    (``rich.control.strip_control_codes``). JSON and CSV keep the text as it came.

    >>> printable("trainer,\\nx \\x1b]0;pwned\\x07 ok")
    'trainer,\\\\nx \\\\x1b]0;pwned\\\\x07 ok'
    >>> printable("python3 -m sglang.launch_server --tp 8 é")
    'python3 -m sglang.launch_server --tp 8 é'
    """
    return text.translate(_ESCAPES)
