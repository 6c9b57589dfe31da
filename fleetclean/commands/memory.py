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
from collections.abc import Mapping

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


def thread_caches_off() -> None:
    """Start this process again with glibc's thread caches off, where it runs on glibc
    and they are on; otherwise (or where the new start cannot be made) go on as it is."""
    value = wanted(os.environ)
    if value is None or not sys.executable or not sys.orig_argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, "GLIBC_TUNABLES": value})
    except OSError:  # an interpreter that cannot be started again: keep the caches
        return
