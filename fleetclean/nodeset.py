"""Fold host names into compact node sets for display, as clush and dshbak do.

Example::

    >>> fold(["gpu01", "gpu02", "gpu03", "gpu05", "login"])
    'gpu[01-03,05],login'
    >>> fold(["a"])
    'a'

Names are grouped by everything except their last run of digits; zero padding is kept and
only numbers of the same width fold together (``gpu9`` and ``gpu10`` stay apart when padded
differently from their neighbours, so the set never names a host that is not in it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def fold(names: Iterable[str]) -> str:
    groups: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    plain: list[str] = []
    order: list[tuple[str, str, int] | str] = []
    for name in dict.fromkeys(names):
        m = _LAST_NUMBER.match(name)
        if not m:
            plain.append(name)
            order.append(name)
            continue
        prefix, digits, suffix = m.groups()
        key = (prefix, suffix, len(digits))
        if key not in groups:
            order.append(key)
        groups[key].append(int(digits))
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, suffix, width = item
        numbers = sorted(set(groups[item]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}{suffix}")
            continue
        parts.append(f"{prefix}[{_ranges(numbers, width)}]{suffix}")
    return ",".join(parts)


def _ranges(numbers: list[int], width: int) -> str:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    return ",".join(out)
