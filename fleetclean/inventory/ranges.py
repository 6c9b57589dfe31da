"""Host ranges: ``gpu[01:16].lab`` <-> the names it stands for.

Ansible's inventory ranges, written without Ansible's code:

- ``[start:end]`` is inclusive at both ends; ``[start:end:step]`` takes every step-th.
- numbers keep zero padding when ``start`` is written with a leading zero (``[01:16]`` gives
  ``01 .. 16``); letters run through one case (``[a:f]``).
- several ranges in one name multiply (``rack[1:2]-gpu[a:b]`` gives four names, left range
  outermost).

>>> expand("gpu[01:03].lab")
['gpu01.lab', 'gpu02.lab', 'gpu03.lab']
>>> expand("node[1:9:4]")
['node1', 'node5', 'node9']
>>> as_patterns(["gpu01", "gpu02", "gpu03", "login"])
['gpu[01:03]', 'login']
>>> expand("gpu[10:01]")
Traceback (most recent call last):
...
fleetclean.inventory.ranges.RangeError: host range 'gpu[10:01]' runs backwards (10 comes after 01)

``RangeError`` carries no file position; callers that know where the name was written wrap it
in an ``InventoryError`` (``offset`` is where in the name the bad bracket starts).
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from fleetclean.nodeset import fold_groups

# The most hosts one range makes: ten times the largest fleet fleetclean is built for;
# past it, a typo (node[1:100000000]) hung the command while it listed the names.
MAX_HOSTS = 100_000

__all__ = ["RangeError", "as_patterns", "expand", "has_range"]


class RangeError(ValueError):
    """A malformed host range; ``hint`` says how to write it, ``offset`` where it starts."""

    def __init__(self, message: str, *, hint: str | None = None, offset: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.offset = offset


def has_range(name: str) -> bool:
    """True when ``name`` contains a bracket, i.e. must go through :func:`expand`."""
    return "[" in name or "]" in name


def expand(pattern: str) -> list[str]:
    """Every name ``pattern`` stands for, in ascending order; a plain name gives itself."""
    open_at = pattern.find("[")
    close_at = pattern.find("]")
    if open_at < 0:
        if close_at >= 0:
            raise RangeError(
                f"host name '{pattern}' has a ']' without a '['",
                hint="write a range as name[01:08]",
                offset=close_at,
            )
        return [pattern]
    close_at = pattern.find("]", open_at)
    if close_at < 0:
        raise RangeError(
            f"host range '{pattern}' has an unclosed '['",
            hint="close it, e.g. gpu[01:08]",
            offset=open_at,
        )
    body = pattern[open_at + 1 : close_at]
    if "[" in body:
        raise RangeError(
            f"host range '{pattern}' nests '[' inside '['",
            hint="ranges cannot nest; write gpu[01:08]",
            offset=open_at,
        )
    head, tail = pattern[:open_at], pattern[close_at + 1 :]
    values = _range_values(pattern, body, open_at)
    # Expanding the tail first keeps the left-most range outermost in the output order.
    try:
        tails = expand(tail)
    except RangeError as err:
        err.offset += close_at + 1
        raise
    if len(values) * len(tails) > MAX_HOSTS:  # ranges one after another multiply
        raise RangeError(
            f"host pattern '{pattern}' makes {len(values) * len(tails):,} hosts, more than "
            f"{MAX_HOSTS:,}",
            hint="check its ranges; split a larger fleet into several inventories",
            offset=open_at,
        )
    return [f"{head}{value}{rest}" for value in values for rest in tails]


def _range_values(pattern: str, body: str, offset: int) -> list[str]:
    parts = body.split(":")
    if len(parts) not in (2, 3):
        raise RangeError(
            f"host range '{pattern}' needs start:end or start:end:step inside '[...]'",
            hint="write gpu[01:08] or gpu[1:9:2]",
            offset=offset,
        )
    start, end = parts[0].strip(), parts[1].strip()
    step_text = parts[2].strip() if len(parts) == 3 else "1"
    # Ansible lets the start be left out ("[:3]"): it means 0.
    start = start or "0"
    if not _digits(step_text) or int(step_text) < 1:
        raise RangeError(
            f"host range '{pattern}' has a bad step '{step_text}'",
            hint="the step is a whole number of at least 1, as in [1:9:2]",
            offset=offset,
        )
    step = int(step_text)
    if _digits(start) and _digits(end):
        return _number_values(pattern, start, end, step, offset)
    if _is_letter(start) and _is_letter(end) and start.islower() == end.islower():
        return _letter_values(pattern, start, end, step, offset)
    bad = end if (_digits(start) or _is_letter(start)) else start
    which = "end" if bad is end else "start"
    raise RangeError(
        f"host range '{pattern}' has a bad {which} '{bad}'",
        hint="use numbers as in [01:16] or single letters of one case as in [a:f]",
        offset=offset,
    )


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit also takes "²" and "٣", which int() refuses or reads."""
    return text.isascii() and text.isdigit()


def _is_letter(text: str) -> bool:
    return len(text) == 1 and text in string.ascii_letters


def _number_values(pattern: str, start: str, end: str, step: int, offset: int) -> list[str]:
    padded = start.startswith("0") and len(start) > 1
    width = len(start) if padded else 0
    if padded and len(end) != width:
        raise RangeError(
            f"host range '{pattern}' pads start '{start}' to {width} digits but end '{end}' "
            f"has {len(end)}",
            hint="write both ends with the same number of digits, e.g. [001:100]",
            offset=offset,
        )
    first, last = int(start), int(end)
    if first > last:
        raise RangeError(
            f"host range '{pattern}' runs backwards ({start} comes after {end})",
            hint=f"write [{end}:{start}]",
            offset=offset,
        )
    count = (last - first) // step + 1
    if count > MAX_HOSTS:
        raise RangeError(
            f"host range '{pattern}' makes {count:,} hosts, more than {MAX_HOSTS:,}",
            hint="check its end; split a larger fleet into several inventories",
            offset=offset,
        )
    return [str(n).zfill(width) for n in range(first, last + 1, step)]


def _letter_values(pattern: str, start: str, end: str, step: int, offset: int) -> list[str]:
    if start > end:
        raise RangeError(
            f"host range '{pattern}' runs backwards ({start} comes after {end})",
            hint=f"write [{end}:{start}]",
            offset=offset,
        )
    return [chr(c) for c in range(ord(start), ord(end) + 1, step)]


def as_patterns(names: Iterable[str]) -> list[str]:
    """Names as Ansible range patterns, one per run of :func:`fleetclean.nodeset.fold_groups`:
    the table's fold written so that ``-l`` and :func:`expand` take it back.

    ``sorted(n for p in as_patterns(ns) for n in expand(p)) == sorted(set(ns))`` holds for
    any names without brackets.
    """
    out: list[str] = []
    for group in fold_groups(names):
        if not group.runs:
            out.append(group.prefix)
        for first, last in group.runs:
            body = first if first == last else f"[{first}:{last}]"
            out.append(f"{group.prefix}{body}{group.suffix}")
    return out
