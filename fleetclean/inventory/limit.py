"""``-l/--limit`` host patterns, with Ansible's meaning.

A limit is a list of terms split on ``,`` or ``:`` (not inside ``[...]`` or ``{...}``):

==================  =====================================================================
``gpu01.lab``       that host; a group name means all its hosts; ``all`` and ``*`` mean all
``gpu0*``           shell glob over host and group names (case-sensitive)
``gpu[01:04].lab``  host range (see :mod:`fleetclean.inventory.ranges`)
``gpu[01-04,07]``   node set, as the table, clush and pdsh fold names
``training[0:2]``   Ansible's subscript of a group: its 1st to 3rd host (end inclusive);
                    ``[0]``, ``[-1]``, ``[:2]``, ``[2:]`` too
``~gpu0[1-4]``      regular expression, matched from the start of host and group names
``@file``           one pattern per line of ``file`` (blank lines and ``#`` comments skipped)
``&group``          keep only hosts also in ``group`` (intersection)
``!group``          drop the hosts of ``group`` (exclusion)
==================  =====================================================================

Like Ansible, the plain terms are united first, then every ``&`` term intersects, then every
``!`` term removes, whatever order they were written in; a limit with only ``&``/``!`` terms
starts from all hosts. Hosts come back in inventory order. Unlike Ansible, which warns and
goes on, a term that matches no host or group name (a typo, most likely: in a ``!`` term it
would spare nothing) and a limit with no pattern at all (``,``, an empty ``@file``,
``all:!``) are refused; an existing group with no hosts is no typo.

>>> hosts = ["gpu01", "gpu02", "h200-01"]
>>> groups = {"all": tuple(hosts), "extraction": ("gpu01", "gpu02"), "training": ("h200-01",)}
>>> select_names("all:!extraction", hosts, groups)
['h200-01']
>>> select_names("gpu9*", hosts, groups, source="lab.yml")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: lab.yml: --limit 'gpu9*' selects no host ('gpu9*' matches ...)
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

from fleetclean import nodeset
from fleetclean.errors import InventoryError
from fleetclean.inventory import ranges

__all__ = ["select_names", "split_terms"]

_SUBSCRIPT = re.compile(r"^(?P<base>.+)\[(?:(?P<index>-?\d+)|(?P<start>\d*):(?P<end>\d*))\]$")
_GLOB = re.compile(r"[*?]|\[[^:\]]*\]")


def split_terms(limit: str) -> list[str]:
    """Split a limit on ``,`` and ``:`` outside brackets, dropping empty terms."""
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in limit:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        if char in ",:" and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term.strip() for term in terms if term.strip()]


def select_names(
    limit: str | None,
    hosts: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    *,
    source: str | None = None,
) -> list[str]:
    """Host names ``limit`` selects, in ``hosts`` order; ``None``/empty selects all.

    Raises ``InventoryError`` (``source`` as its path) when the limit selects nothing, reads
    a missing ``@file``, or holds a bad range or regular expression.
    """
    if limit is None or not limit.strip():
        return list(hosts)
    terms = list(_expand_files(split_terms(limit), limit, source))
    # A limit that names nothing (",", an empty @file, "all:!") is no limit at all: taken
    # for "every host", a script passing an empty list of hosts to retry ran on the fleet.
    if not terms or any(t in ("&", "!") for t in terms):
        raise InventoryError(
            f"--limit '{limit}' " + ("holds no host pattern" if not terms
                                     else "has a '&' or '!' with no pattern after it"),
            path=source,
            hint="name hosts or groups (an @FILE with at least one); leave --limit out to "
                 "select every host",
        )
    plain = [t for t in terms if not t.startswith(("&", "!"))]
    chosen: set[str] = set() if plain else set(hosts)
    empty_terms: list[str] = []
    for term in plain:
        found = _match(term, limit, hosts, groups, source)
        if not found and term not in groups:  # an empty group is no typo
            empty_terms.append(term)
        chosen |= found
    for term in terms:
        if term.startswith("&"):
            found = _match(term[1:], limit, hosts, groups, source)
            if not found:
                empty_terms.append(term[1:])
            chosen &= found
    for term in terms:
        if term.startswith("!"):
            found = _match(term[1:], limit, hosts, groups, source)
            if not found and term[1:] not in groups:
                empty_terms.append(term[1:])
            chosen -= found
    # A term that matches nothing is a typo, most likely; in an exclusion it would have
    # run on the very host it was written to spare. Ansible warns and goes on; this stops.
    selected = [h for h in hosts if h in chosen]
    if empty_terms or not selected:
        raise InventoryError(
            f"--limit '{limit}' "
            + ("selects no host" if not selected else "has a pattern that matches nothing"),
            path=source,
            hint=_why_empty(empty_terms, hosts, groups),
        )
    return selected


def _expand_files(terms: list[str], limit: str, source: str | None) -> Iterator[str]:
    for term in terms:
        prefix, body = (term[0], term[1:]) if term[:1] in "&!" else ("", term)
        if not body.startswith("@"):
            yield term
            continue
        path = os.path.expanduser(body[1:])
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            missing = isinstance(err, FileNotFoundError)
            reason = "does not exist" if missing else f"is unreadable: {err}"
            raise InventoryError(
                f"--limit file '{path}' {reason}",
                path=source,
                hint="write @FILE with one host pattern per line",
            ) from None
        for line in lines:
            pattern = line.split("#", 1)[0].strip()
            if pattern:
                yield from (prefix + t for t in split_terms(pattern))


def _match(
    term: str,
    limit: str,
    hosts: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    source: str | None,
) -> set[str]:
    """Hosts one term (without ``&``/``!``) stands for."""
    if term in ("all", "*"):
        return set(hosts)
    if term.startswith("~"):
        try:
            with warnings.catch_warnings():  # [[:digit:]]: engine/checks.py check_ere says why
                warnings.simplefilter("ignore", FutureWarning)
                regex = re.compile(term[1:])
        except re.error as err:
            raise InventoryError(
                f"--limit '{limit}' has a bad regular expression '{term[1:]}': {err}",
                path=source,
                hint="fix the expression after '~'",
            ) from None
        return _names_matching(regex.match, hosts, groups)
    subscript = _SUBSCRIPT.match(term)
    if subscript and subscript["base"] in groups:
        return _subscript(groups[subscript["base"]], subscript)
    named = _named(term, hosts, groups)
    if named is not None:
        return named
    if ranges.has_range(term) and ":" in term:
        try:
            names = ranges.expand(term)
        except ranges.RangeError as err:
            raise InventoryError(
                f"--limit '{limit}': {err.message}", path=source, hint=err.hint
            ) from None
        found: set[str] = set()
        for name in names:
            found |= _match(name, limit, hosts, groups, source)
        return found
    if _GLOB.search(term):
        return _names_matching(lambda name: fnmatch.fnmatchcase(name, term), hosts, groups)
    return set()


def _named(
    term: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]]
) -> set[str] | None:
    """The hosts a term names outright, or None where it names none: a host or group,
    user@host as the inventory took it, or a node set such as gpu[10-12], as the table
    folds names (and clush and pdsh): as a glob, [10-12] is one character of 1, 0-1 or 2,
    and a pasted limit selected gpu0, gpu1 and gpu2."""
    if term in groups or term in hosts:
        return set(groups.get(term, ())) | ({term} if term in hosts else set())
    if "@" in term and term.rpartition("@")[2] in hosts:
        return {term.rpartition("@")[2]}
    if "[" in term and not any(c in term for c in "*?"):
        with contextlib.suppress(ValueError):
            names = nodeset.expand(term)
            return {n for n in names if n in hosts} | {h for n in names for h in groups.get(n, ())}
    return None


def _names_matching(
    test: Callable[[str], object], hosts: Sequence[str], groups: Mapping[str, Sequence[str]]
) -> set[str]:
    found = {h for h in hosts if test(h)}
    for group, members in groups.items():
        if test(group):
            found.update(members)
    return found


def _subscript(members: Sequence[str], match: re.Match[str]) -> set[str]:
    if match["index"] is not None:
        index = int(match["index"])
        return {members[index]} if -len(members) <= index < len(members) else set()
    start = int(match["start"]) if match["start"] else 0
    # Ansible's subscript end is inclusive: webservers[0:2] is three hosts.
    end = int(match["end"]) + 1 if match["end"] else len(members)
    return set(members[start:end])


def _why_empty(
    empty_terms: list[str], hosts: Sequence[str], groups: Mapping[str, Sequence[str]]
) -> str:
    if not empty_terms:
        return "the hosts it names are all removed again by its '&' or '!' terms"
    term = empty_terms[0]
    close = difflib.get_close_matches(term, [*groups, *hosts], n=1, cutoff=0.7)
    if close:
        return f"'{term}' matches no host or group name; did you mean '{close[0]}'?"
    known = ", ".join(ranges.as_patterns(hosts))
    return f"'{term}' matches no host or group name; hosts are {known}"
