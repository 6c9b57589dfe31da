"""Fold host names into compact node sets for display, as clush and dshbak do.

This is fleetclean's one fold. The table shows its ClusterShell form (:func:`fold`); hints
that users paste into ``-l`` show the same grouping in Ansible's range syntax
(:func:`fleetclean.inventory.ranges.as_patterns`), built from :func:`fold_groups`.

Example::

    >>> fold(["gpu01", "gpu02", "gpu03", "gpu05", "login"])
    'gpu[01-03,05],login'
    >>> fold(["a"])
    'a'
    >>> fold_groups(["gpu01", "gpu02", "login"])  # doctest: +NORMALIZE_WHITESPACE
    [NodeGroup(prefix='gpu', suffix='', runs=(('01', '02'),)),
     NodeGroup(prefix='login', suffix='', runs=())]

Names are grouped by everything except their last run of digits; zero padding is kept and
only numbers of the same width fold together (``gpu9`` and ``gpu10`` stay apart when padded
differently from their neighbours, so the set never names a host that is not in it).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["NodeGroup", "expand", "fold", "fold_groups"]

_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


@dataclass(frozen=True)
class NodeGroup:
    """Names ``prefix + N + suffix`` for every N in ``runs`` (first, last as written, same
    width, inclusive); a name without a number is a group of its own with no runs."""

    prefix: str
    suffix: str
    runs: tuple[tuple[str, str], ...]


def fold(names: Iterable[str]) -> str:
    """ClusterShell's node set: ``gpu[01-03,05],login``."""
    parts: list[str] = []
    for group in fold_groups(names):
        runs = group.runs
        if not runs:
            parts.append(group.prefix)
        elif len(runs) == 1 and runs[0][0] == runs[0][1]:
            parts.append(f"{group.prefix}{runs[0][0]}{group.suffix}")
        else:
            body = ",".join(first if first == last else f"{first}-{last}" for first, last in runs)
            parts.append(f"{group.prefix}[{body}]{group.suffix}")
    return ",".join(parts)


def expand(nodeset: str) -> list[str]:
    """The names a node set stands for, as clush and pdsh print them (the inverse of
    :func:`fold`); ValueError for one that is not a node set.

    >>> expand("gpu[01-03,05],login")
    ['gpu01', 'gpu02', 'gpu03', 'gpu05', 'login']
    >>> expand("rack[1-2]-gpu[7-8]")
    ['rack1-gpu7', 'rack1-gpu8', 'rack2-gpu7', 'rack2-gpu8']
    >>> expand("gpu[3-1]")
    Traceback (most recent call last):
    ValueError: not a node set: 'gpu[3-1]'
    """
    names: list[str] = []
    for part in _top_level(nodeset):
        names += _expand_one(part, nodeset)
    return names


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _top_level(nodeset: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(nodeset):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            parts.append(nodeset[start:i])
            start = i + 1
    parts.append(nodeset[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str, whole: str) -> list[str]:
    m = _BRACKET.search(part)
    if m is None:
        if "[" in part or "]" in part or not part:
            raise ValueError(f"not a node set: {whole!r}")
        return [part]
    values: list[str] = []
    for item in m.group(1).split(","):
        first, _, last = item.strip().partition("-")
        last = last or first
        if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
            raise ValueError(f"not a node set: {whole!r}")
        width = len(first) if first.startswith("0") else 0
        values += [f"{n:0{width}d}" for n in range(int(first), int(last) + 1)]
    head, tail = part[: m.start()], part[m.end():]
    return [name for v in values for name in _expand_one(head + v + tail, whole)]


def fold_groups(names: Iterable[str]) -> list[NodeGroup]:
    """Groups in the order their first name came in; runs ascending; duplicates dropped."""
    numbers: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    order: list[tuple[str, str, int] | str] = []
    for name in dict.fromkeys(names):
        m = _LAST_NUMBER.match(name)
        if not m:
            order.append(name)
            continue
        prefix, digits, suffix = m.groups()
        key = (prefix, suffix, len(digits))
        if key not in numbers:
            order.append(key)
        numbers[key].append(int(digits))
    groups: list[NodeGroup] = []
    for item in order:
        if isinstance(item, str):
            groups.append(NodeGroup(item, "", ()))
            continue
        prefix, suffix, width = item
        runs = _runs(sorted(set(numbers[item])))
        written = tuple((f"{a:0{width}d}", f"{b:0{width}d}") for a, b in runs)
        groups.append(NodeGroup(prefix, suffix, written))
    return groups


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers -> (first, last) of each stretch of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs
