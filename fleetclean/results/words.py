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
