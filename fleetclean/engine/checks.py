"""Type checks for option values: ``check(value, where, what) -> typed value``.

Every check takes a value after ``{{ }}`` substitution, the :class:`Location` it was
written at (or None) and a label for messages, and returns the typed value or raises a
:class:`VariableError` naming file:line. A stage type names one check per option.

>>> number("2.5", None, "grace")
2.5
>>> number("soon", None, "grace")
Traceback (most recent call last):
fleetclean.errors.VariableError: grace must be a non-negative number of seconds, not 'soon'
>>> signal_name("sigint", None, "signal")
'INT'
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetclean.engine.model import Location
from fleetclean.errors import VariableError

Check = Callable[[Any, "Location | None", str], Any]
"""``check(value, where, what)``: the typed value, or a VariableError."""

SIGNALS = ("TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2")

# Constructs Python's re accepts that bash's =~ (POSIX ERE) reads differently or rejects.
_PY_ONLY_ESCAPES = set("dDAZzxuUNpPgk0123456789")

# Command lines that no teardown means to target. A pattern matching several of them
# ('.+', 's', '[a-z]') would signal most of a host.
_BYSTANDERS = (
    "/sbin/init", "sshd: root@notty", "-bash", "/usr/lib/systemd/systemd-journald",
    "/usr/sbin/cron -f", "sleep 60", "/usr/bin/dockerd -H fd://", "tmux", "vim notes.txt",
    "top",
)


def err(where: Location | None, message: str, hint: str | None = None) -> VariableError:
    """A VariableError at ``where`` (no location: the message alone)."""
    if where is None:
        return VariableError(message, hint=hint)
    return VariableError(message, path=where.path, line=where.line, column=where.column,
                         hint=hint)


def scalar_text(value: Any, name: str, where: Location | None) -> str:
    """A scalar as the text it stands for inside a string (``True`` -> ``"true"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (str, int, float)):
        return str(value)
    raise err(where, f"variable '{name}' is a {type(value).__name__}; it can only be used "
                     "as a whole value, not inside a string")


def no_nul(text: str, where: Location | None, what: str) -> str:
    if "\0" in text:
        raise err(where, f"{what}: contains a NUL byte, which bash cannot carry")
    return text


def text(value: Any, where: Location | None, what: str) -> str:
    """Any scalar as a string; a list or mapping is an error.

    >>> text(3, None, "suffix")
    '3'
    """
    if isinstance(value, (list, dict)):
        raise err(where, f"{what} must be a string, not a {type(value).__name__}")
    return no_nul(scalar_text(value, what, where), where, what)


def suffix(value: Any, where: Location | None, what: str) -> str:
    """A backup's suffix: what follows the file's name in the same directory. Empty, the
    backup was the file itself, and a restore copied the patched file onto itself and
    said it had restored it; with a '/', it named a file elsewhere.

    >>> suffix(".bak_hsdump", None, "backup_suffix")
    '.bak_hsdump'
    >>> suffix("", None, "backup_suffix")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: backup_suffix is empty, so the backup would be the file itself (e.g. .bak)
    """  # noqa: E501
    given = text(value, where, what)
    if not given:
        raise err(where, f"{what} is empty, so the backup would be the file itself",
                  "e.g. .bak")
    if "/" in given:
        raise err(where, f"{what} {given!r} holds a '/', so the backup would be another "
                         "file than the one beside it", "e.g. .bak")
    return given


MAX_SECONDS = 7 * 24 * 3600


def number(value: Any, where: Location | None, what: str, *, positive: bool = False) -> float:
    """A non-negative (or, with ``positive``, a strictly positive) number of seconds."""
    result: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            result = None
    if result is None or not math.isfinite(result) or result < 0 or (positive and result == 0):
        kind = "a positive" if positive else "a non-negative"
        raise err(where, f"{what} must be {kind} number of seconds, not {value!r}")
    # A week at most: the script counts in milliseconds in bash's 64-bit integers, where
    # 1e23 s wrapped to a negative grace, i.e. none.
    if result > MAX_SECONDS:
        raise err(where, f"{what} is {value!r} seconds, more than a week ({MAX_SECONDS})",
                  "give a number of seconds of at most a week")
    return result


def positive_number(value: Any, where: Location | None, what: str) -> float:
    """
    >>> positive_number(0, None, "interval")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: interval must be a positive number of seconds, not 0
    """
    return number(value, where, what, positive=True)


def integer(value: Any, where: Location | None, what: str) -> int:
    """A non-negative integer; ``"12"`` is accepted, ``True`` and ``1.5`` are not."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise err(where, f"{what} must be a non-negative integer, not {value!r}")
    return value


def boolean(value: Any, where: Location | None, what: str) -> bool:
    """YAML's and the shell's spellings of true and false.

    >>> boolean("no", None, "tree"), boolean("on", None, "tree")
    (False, True)
    """
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0", ""):
        return False
    raise err(where, f"{what} must be true or false, not {value!r}")


def signal_name(value: Any, where: Location | None, what: str) -> str:
    name = str(value).upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise err(where, f"{what}: unknown signal {value!r}",
                  f"expected one of: {', '.join(SIGNALS)}")
    return name


def _posix_only(pattern: str, where: Location | None, what: str) -> None:
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _PY_ONLY_ESCAPES:
                raise err(where, f"{what}: '\\{nxt}' is not POSIX ERE (bash =~ reads it "
                                 f"differently) in {pattern!r}",
                          "use [0-9] for \\d, or a bracket expression")
            i += 2
            continue
        if ch == "(" and pattern[i + 1:i + 2] == "?":
            raise err(where, f"{what}: '(?' groups are not POSIX ERE in {pattern!r}")
        if ch in "*+?}" and pattern[i + 1:i + 2] == "?":
            raise err(where, f"{what}: lazy quantifier '{ch}?' is not POSIX ERE in {pattern!r}")
        i += 1


def check_ere(pattern: Any, where: Location | None, what: str) -> str:
    """Accept a regex only if Python compiles it and bash's POSIX ERE reads it the same
    way: no ``(?...)`` groups, lazy quantifiers or Perl escapes such as ``\\d``.

    >>> check_ere(r"sglang\\.launch_server", None, "pattern")
    'sglang\\\\.launch_server'
    >>> check_ere(r"worker\\d+", None, "pattern")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: pattern: '\\d' is not POSIX ERE ... (use [0-9] for ...)
    """
    value = text(pattern, where, what)
    if not value:
        # bash's [[ x =~ "" ]] is true for every x: an empty pattern would target every
        # process on the host.
        raise err(where, f"{what} is empty, so it would match every process",
                  "give a specific pattern, e.g. -e server_pattern=sglang.launch_server")
    try:
        # POSIX classes ([[:space:]]) are what bash's ERE wants; Python warns of them (a
        # FutureWarning: a nested set), which the user would see on stderr.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            compiled = re.compile(value)
    except re.error as exc:
        raise err(where, f"{what}: invalid regular expression {value!r}: {exc}") from exc
    _posix_only(value, where, what)
    if compiled.search("") is not None:
        raise err(where, f"{what}: {value!r} matches the empty string, so it matches "
                         "every process", "make the pattern specific")
    return value


def check_target_pattern(value: Any, where: Location | None, what: str) -> str:
    """A stage's target pattern: a valid ERE (see :func:`check_ere`) that is not so broad
    that it matches ordinary processes.

    >>> check_target_pattern("sglang", None, "pattern")
    'sglang'
    >>> check_target_pattern(".+", None, "pattern")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: pattern: '.+' would match ordinary processes ...
    """
    pattern = check_ere(value, where, what)
    hits = [c for c in _BYSTANDERS if re.search(pattern, c)]
    if len(hits) >= 3:
        shown = ", ".join(repr(c) for c in hits[:3])
        raise err(where, f"{what}: {pattern!r} would match ordinary processes such as {shown}",
                  "make the pattern name what you mean to stop, e.g. sglang.launch_server")
    return pattern


def ere_or_empty(value: Any, where: Location | None, what: str) -> str:
    """An optional ERE: empty means "no filter"."""
    pattern = text(value, where, what)
    return check_ere(pattern, where, what) if pattern else ""


def abs_path(value: Any, where: Location | None, what: str) -> str:
    """An absolute path, or empty.

    >>> abs_path("dump", None, "file")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: file must be an absolute path, not 'dump'
    """
    path = text(value, where, what)
    if path and not path.startswith("/"):
        raise err(where, f"{what} must be an absolute path, not {path!r}")
    return path


def deep_paths(value: Any, where: Location | None, what: str) -> list[str]:
    """One path or a list of them, each absolute and at least two levels deep.

    >>> deep_paths(["/dev/shm/a", "/tmp/../dev/shm/b"], None, "paths")
    ['/dev/shm/a', '/tmp/../dev/shm/b']
    >>> deep_paths("/tmp/x/..", None, "paths")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: paths: refusing '/tmp/x/..': it is / or a top-level ...
    """
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        path = abs_path(item, where, what)
        if not path:
            raise err(where, f"{what}: empty path")
        parts = [p for p in Path(path).parts if p not in ("/", ".")]
        depth = 0
        for part in parts:
            depth = max(depth - 1, 0) if part == ".." else depth + 1
        if depth < 2:
            raise err(where, f"{what}: refusing {path!r}: it is / or a top-level directory",
                      "name a path at least two levels deep, e.g. /dev/shm/sglang_hs")
        out.append(path)
    return out


def names(value: Any, where: Location | None) -> list[str]:
    """``protect`` as a list, or a comma/space-separated string.

    >>> names("jupyter, tensorboard", None)
    ['jupyter', 'tensorboard']
    """
    if isinstance(value, str):
        return [n for n in re.split(r"[\s,]+", value) if n]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [no_nul(v.strip(), where, "protect") for v in value if v.strip()]
    raise err(where, f"protect must be a list of names or a comma-separated string, "
                     f"not {value!r}")
