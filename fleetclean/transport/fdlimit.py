"""Open files for a run, within what this process may open: every host in flight holds a
socket (and a ProxyCommand's pipes), and ``status --watch`` keeps one connection per host
for the whole watch. The usual soft limit is 1,024 on Linux and 256 on macOS, the hard
limit far higher (often 524,288 under systemd): the soft one is raised as far as a run
needs and the hard one allows, before any host is contacted. What still does not fit is
scaled down (fewer hosts at once, fewer connections kept), never left to fail hosts with
"Too many open files" halfway through.

>>> fits = forks_that_fit(64)
>>> 1 <= fits <= 64
True
"""

from __future__ import annotations

import sys

SPARE = 64  # the interpreter's own files: stdio, logs, run records, the terminal
PER_HOST = 4  # a host in flight: its socket, or a ProxyCommand's socket and pipes
PER_KEPT = 1  # a kept connection between refreshes: its socket
# macOS refuses a soft limit above OPEN_MAX (10,240) even under an unlimited hard limit.
_MACOS_OPEN_MAX = 10240


def raise_soft(wanted: int) -> int:
    """Raise this process's soft limit on open files to ``wanted`` where it is lower (up
    to the hard limit); the soft limit after it (``sys.maxsize``: unlimited)."""
    if sys.platform == "win32":  # no RLIMIT_NOFILE there, nor this kind of limit on sockets
        return sys.maxsize
    import resource  # POSIX only

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    if soft >= wanted:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if sys.platform == "darwin":
        target = min(target, _MACOS_OPEN_MAX)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a platform's own cap: keep what there is
        return soft
    return target


def forks_that_fit(forks: int) -> int:
    """How many hosts may be in flight at once: ``forks``, or as many as the limit on open
    files allows (at least one)."""
    limit = raise_soft(SPARE + forks * PER_HOST)
    return max(1, min(forks, (limit - SPARE) // PER_HOST))


def kept_that_fit(hosts: int, forks: int) -> int:
    """How many hosts' connections a watch may keep between refreshes, ``forks`` hosts
    being in flight besides: every host's, or as many as the limit allows."""
    limit = raise_soft(SPARE + forks * PER_HOST + hosts * PER_KEPT)
    return max(0, min(hosts, (limit - SPARE - forks * PER_HOST) // PER_KEPT))
