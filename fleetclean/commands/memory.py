"""``status --watch`` without glibc's per-thread malloc caches.

A watch keeps one connection per host between refreshes, and paramiko gives each its own
thread (``Transport.run``). glibc keeps, per thread, a cache of the small blocks that thread
freed (tcache: up to 7 of each size to 1 KiB), for that thread alone to reuse; an idle
connection's thread keeps its cache for the whole watch. At 1,000 hosts those caches were
35 MiB of the watch's 162 MiB peak (``benchmarks/RESULTS.md``, issue 18, sixth round), with
no CPU cost seen from turning them off. glibc reads the switch (``GLIBC_TUNABLES``) only when a
process starts, and has no call to change it later (``mallopt`` knows no tcache), so a watch
starts itself once more, at once, with it set: before it has printed, asked or connected
anything, under the same PID, arguments and terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

TUNABLE = "glibc.malloc.tcache_count=0"


def tunables(environ: Mapping[str, str]) -> str | None:
    """``GLIBC_TUNABLES`` with the thread caches off; None where they are already set
    (this process was started with it, or the user chose their own count).

    >>> tunables({}), tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    ('glibc.malloc.tcache_count=0', 'glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0')
    >>> tunables({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=3"}) is None
    True
    """
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.tcache_count=" in current:
        return None
    return f"{current}:{TUNABLE}" if current else TUNABLE


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # musl, macOS: no such name
        return False


def wanted(environ: Mapping[str, str]) -> str | None:
    """The ``GLIBC_TUNABLES`` a watch starts itself again with, here; None where it
    does not (no glibc, or the thread caches already set)."""
    if not sys.platform.startswith("linux") or not _glibc():
        return None
    return tunables(environ)


def thread_caches_off(environ: dict[str, str]) -> None:
    """Start this process again with glibc's thread caches off, where it runs on glibc
    and they are on; otherwise (or where the new start cannot be made) go on as it is.
    In the process so started, put ``GLIBC_TUNABLES`` back as the user had it, in
    ``os.environ`` and in ``environ`` (the command's copy), so that what the run starts
    (a ProxyCommand, a local host's script) does not inherit the switch."""
    if _REEXEC in os.environ:  # started again already: once is all (never a loop)
        was = os.environ[_REEXEC]
        for copy in (os.environ, environ):
            if _REEXEC in copy:
                _restore(copy, was)
        return
    value = wanted(os.environ)
    if value is None or not _restartable():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    user = os.environ.get("GLIBC_TUNABLES")
    try:
        os.execve(sys.executable, sys.orig_argv,
                  {**os.environ, "GLIBC_TUNABLES": value,
                   _REEXEC: "-" if user is None else f"+{user}"})
    except OSError:  # an interpreter that cannot be started again: keep the caches
        return


# Set in the process started again: "+" and the user's GLIBC_TUNABLES, or "-" for none.
_REEXEC = "FLEETCLEAN_GLIBC_TUNABLES_BEFORE"


def _restore(environ: MutableMapping[str, str], before: str) -> None:
    """Put ``GLIBC_TUNABLES`` back as ``before`` (a ``_REEXEC`` value) says.

    >>> e = {"GLIBC_TUNABLES": TUNABLE, _REEXEC: "-"}; _restore(e, "-"); e
    {}
    >>> e = {"GLIBC_TUNABLES": f"a=1:{TUNABLE}"}; _restore(e, "+a=1"); e
    {'GLIBC_TUNABLES': 'a=1'}
    """
    environ.pop(_REEXEC, None)
    if before.startswith("+"):
        environ["GLIBC_TUNABLES"] = before[1:]
    else:
        environ.pop("GLIBC_TUNABLES", None)


def _restartable() -> bool:
    """Whether ``sys.orig_argv`` starts this same command again: a script or ``-m``
    module whose arguments it ends with (not where the program rewrote ``sys.argv``).
    Not a program read from stdin, whose text is gone; not ``-c`` code either, whose text
    is there but which is not the CLI (a test's or a tool's own code, left as it runs)."""
    if not sys.executable or not sys.orig_argv or sys.argv[0] in ("", "-", "-c"):
        return False
    rest = sys.argv[1:]
    return not rest or sys.orig_argv[-len(rest):] == rest
