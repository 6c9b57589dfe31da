"""ssh_config's ``Include``, expanded into one text that means what OpenSSH reads.

paramiko's SSHConfig has no ``Include`` (https://github.com/paramiko/paramiko/issues/1609,
open since 2020), so the files are read here and handed to it as one text. Pasting each
included file in place of its line is not enough; OpenSSH gives an Include two rules that a
paste breaks:

- the lines after an Include stay in the block the Include was in. Pasted, they fell into the
  included file's last ``Host`` block: a ``User ops`` after ``Include conf.d/*`` applied to
  one host of conf.d instead of to all of them;
- an Include inside a ``Host`` or ``Match`` block is conditional: the included file's own
  blocks apply only to hosts the enclosing block matches. Pasted, they applied to every host.

Both are kept here: the enclosing block is opened again after each included file, and an
included file's ``Host p`` under ``Host e`` becomes ``Match originalhost e originalhost p``
(``Host`` matches the name as given, which is what ``originalhost`` matches), whose criteria
must all hold. ``ssh -G`` is the reference the tests compare against.

>>> text = expand_text("Host gpu*\\n  Include x\\n  Port 2222\\n",
...                    read=lambda p: "User svc\\nHost b1\\n  HostName 10.0.0.1\\n",
...                    found=lambda w: ["/x"])
>>> print(text)
Host gpu*
User svc
Match originalhost 'gpu*' originalhost b1
HostName 10.0.0.1
Host gpu*
Port 2222
"""

from __future__ import annotations

import glob
import os
import shlex
from collections.abc import Callable

from fleetclean.transport import localnet
from fleetclean.transport.sshlib import paramiko

MAX_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH: deeper is an error there too

_LINE = paramiko.SSHConfig.SETTINGS_REGEX  # a line split as paramiko splits it


def included_files(word: str, base: str = "~/.ssh") -> list[str]:
    """The files one ``Include`` word names: ``~`` expanded, relative names under ``base``
    (~/.ssh for a user's configuration, the system directory for ssh's system-wide one),
    glob patterns sorted, directories and misses skipped."""
    path = os.path.expanduser(word)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser(base), path)
    return [p for p in sorted(glob.glob(path)) if not os.path.isdir(p)]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def expand_file(path: str, base: str = "~/.ssh") -> str:
    """``path``'s text with every Include expanded, relative ones under ``base``; raises
    ``ConfigParseError`` on an Include nested deeper than OpenSSH allows (a file that
    includes itself)."""
    return expand_text(_read(path), read=_read, found=lambda word: included_files(word, base))


def expand_text(
    text: str,
    *,
    read: Callable[[str], str],
    found: Callable[[str], list[str]],
    within: list[str] | None = None,
    depth: int = 0,
) -> str:
    """``text`` with its Includes expanded; ``within``: the Match criteria of the block that
    included it (None: the top level, where every block applies on its own terms)."""
    out: list[str] = []
    # The block the lines now belong to: its header as written out, and its criteria.
    header: str | None = None
    criteria = within
    for raw in text.splitlines():
        line = raw.strip()
        parsed = _LINE.match(line) if line and not line.startswith("#") else None
        if parsed is None:
            out.append(line)
            continue
        keyword, value = parsed.group(1).lower(), parsed.group(2)
        if keyword in ("host", "match"):
            criteria = _criteria(keyword, value)
            if within is not None:
                criteria = [*within, *(criteria or [])]
            # A top-level Match is written again only where it holds "all" beside another
            # criterion (`Match final all`, which Red Hat's ssh_config.d/50-redhat.conf
            # opens with): ssh reads it as `Match final`, paramiko refuses it
            # (https://github.com/paramiko/paramiko/issues/2361).
            # So is one with a criterion paramiko does not know (_judged).
            keep = within is None and not (keyword == "match" and (
                ("all" in _keywords(_words(value)) and len(_words(value)) > 1)
                or criteria != _words(value)))
            header = line if keep else _match_line(criteria)
            out.append(header)
        elif keyword == "include":
            if depth >= MAX_DEPTH:
                raise paramiko.ssh_exception.ConfigParseError(
                    f"Include nested more than {MAX_DEPTH} deep (a file includes itself?)"
                )
            # Each file starts, and the lines after the Include go on, in the block the
            # Include sits in (the file before may have ended in a block of its own).
            # Before any block of this file: the top level, or the block that included it.
            reopen = header if header is not None else _match_line(within)
            for word in _words(value):
                for name in found(word):
                    out.append(expand_text(read(name), read=read, found=found,
                                           within=criteria, depth=depth + 1))
                    out.append(reopen)
        else:
            out.append(line)
    return "\n".join(out)


def _words(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:  # an unbalanced quote: OpenSSH refuses it; take the words as written
        return value.split()


def _criteria(keyword: str, value: str) -> list[str] | None:
    """A block header as Match criteria; None where it matches every host."""
    words = _words(value)
    if keyword == "host":
        return None if words == ["*"] else ["originalhost", ",".join(words)]
    words = _judged(words)
    keywords = _keywords(words)
    if "all" in keywords:  # "Match all", "Match canonical all": every host (of that pass)
        rest = [w for i, w in enumerate(words) if i not in keywords["all"]]
        return rest or None
    return words


# The Match criteria paramiko judges; any other it takes as matching, negated or not
# (https://github.com/paramiko/paramiko/issues/2632): `Match !localnetwork 10.0.0.0/8`
# with an off-site ProxyJump sent every host through it, on site too.
_PARAMIKO_KNOWS = {"all", "canonical", "final", "host", "originalhost", "user", "localuser",
                   "exec"}
_TRUE, _FALSE = "*", "!*"  # `host *` matches every name, `host !*` none


def _judged(words: list[str]) -> list[str]:
    """Match criteria with each one paramiko does not know judged here, as a `host`
    criterion that is true or false: `localnetwork` by this machine's addresses (as ssh);
    `tagged` false (fleetclean sets no Tag); any other (`sessiontype`, `command`,
    `version`, ...) false, so that a block fleetclean cannot judge is never applied.

    >>> _judged(["!localnetwork", "203.0.113.0/24", "user", "ops", "tagged", "x"])
    ['!host', '!*', 'user', 'ops', 'host', '!*']
    """
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        keyword = word.lstrip("!").lower()
        if keyword in ("all", "canonical", "final"):
            out.append(word)
            i += 1
            continue
        argument = words[i + 1] if i + 1 < len(words) else ""
        if keyword in _PARAMIKO_KNOWS:
            out += [word, argument] if argument else [word]
        else:
            holds = keyword == "localnetwork" and localnet.in_networks(argument)
            out += ["!host" if word.startswith("!") else "host", _TRUE if holds else _FALSE]
        i += 2
    return out


def _keywords(words: list[str]) -> dict[str, list[int]]:
    """Where each Match criterion's keyword stands (a word after one that takes an argument
    is that argument: ``Match host all`` names a host called "all")."""
    at: dict[str, list[int]] = {}
    i = 0
    while i < len(words):
        keyword = words[i].lstrip("!").lower()
        at.setdefault(keyword, []).append(i)
        i += 1 if keyword in ("all", "canonical", "final") else 2
    return at


def _match_line(criteria: list[str] | None) -> str:
    """The header of a block with ``criteria`` (None: every host)."""
    return "Host *" if not criteria else "Match " + " ".join(shlex.quote(w) for w in criteria)
