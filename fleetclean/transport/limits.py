"""Files and threads for a run, within what this process may have: every host in flight
holds a socket (and a ProxyCommand's pipes) and paramiko's thread, and ``status --watch``
keeps one connection, a socket and a thread, per host for the whole watch.

Open files: the usual soft limit is 1,024 on Linux and 256 on macOS, the hard limit far
higher (often 524,288 under systemd): the soft one is raised as far as a run needs and the
hard one allows, before any host is contacted. Threads: a cgroup's ``pids.max`` counts
each thread as a task, and past it no thread starts: a systemd unit's ``TasksMax``, a
container's own limit (Docker's ``--pids-limit``), a pod's where the container can see the
pod's cgroup (cgroup v1; under cgroup2 a container's namespace hides it). So does
``ulimit -u`` (RLIMIT_NPROC), which on Linux counts every thread of every process of the
user. What does not fit is scaled down (fewer hosts at once, fewer connections kept) and
said by :class:`Fit`, never left to fail hosts with "Too many open files" or "can't start
new thread" halfway through.

>>> fits = fit_run(64, hosts_kept=256)
>>> 1 <= fits.forks.n <= 64 and 0 <= fits.kept.n <= 256
True
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NamedTuple

from fleetclean import cgroupfs

SPARE = 64  # the interpreter's own files: stdio, logs, run records, the terminal
PER_HOST = 4  # a host in flight: its socket, or a ProxyCommand's socket and pipes
PER_KEPT = 1  # a kept connection between refreshes: its socket
# Threads: the main one, the live view's two (its drawer, rich's refresh) or the output's
# reader, a ProxyCommand's stderr reader, and what the libraries start; a host in flight
# has its worker and paramiko's transport thread, and where it is a library caller's own
# connection (api.py) paramiko's handshake timer too (fleetclean's own connections start
# none: upstream._Packetizer); a kept connection its transport thread.
THREAD_SPARE = 16
THREADS_PER_HOST = 3
THREADS_PER_KEPT = 1
# macOS refuses a soft limit above OPEN_MAX (10,240) even under an unlimited hard limit.
_MACOS_OPEN_MAX = 10240
FILES = "the open-files limit (ulimit -n)"
USER_TASKS = "the user's limit on processes (ulimit -u)"


class Fit(NamedTuple):
    """How many fit, and what cut them (``""``: nothing, all that was asked)."""

    n: int
    by: str = ""


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


def threads_left(root: Path = Path("/")) -> Fit:
    """How many more threads this process may start before a cgroup's ``pids.max`` refuses
    one (its own cgroup's or an ancestor's, in the pids hierarchy of cgroup v1 or in
    cgroup2), and the file that sets it; ``sys.maxsize`` where none does. ``root``: where
    ``/proc`` and ``/sys`` are (a test's tree).

    Not counted here: ``ulimit -u`` (:func:`user_tasks_left`) and the kernel's
    ``threads-max`` (a system-wide ceiling, tens of thousands and more).
    """
    try:
        mountinfo = (root / "proc/self/mountinfo").read_text()
        own = cgroupfs.own_cgroups((root / "proc/self/cgroup").read_text())
    except OSError:  # not Linux, or no /proc
        return Fit(sys.maxsize)
    left = Fit(sys.maxsize)
    for hierarchy in cgroupfs.mounted_hierarchies(mountinfo, binds=True):
        if not (hierarchy.v2 or "pids" in hierarchy.key.split(",")):
            continue
        where = cgroupfs.in_mount(hierarchy, own.get(hierarchy.key, ""))
        if where is None:
            continue
        cgroup = root / where.lstrip("/")
        top = root / hierarchy.mount.lstrip("/")
        # up to the mount's top too: where a container sees its own cgroup as the root
        # (a cgroup namespace, or a v1 bind of it), its pids.max is there; the true root
        # cgroup has none, so reading it costs nothing
        chain = [cgroup, *cgroup.parents]
        if top not in chain:
            continue
        for level in chain:
            room = _room(level)
            if room is not None and room < left.n:
                left = Fit(room, f"{level.relative_to(root).as_posix()}/pids.max")
            if level == top:
                break
    return left


class Given(NamedTuple):
    """A test's ``ulimit -u`` and real user, in place of this process's own."""

    limit: int
    uid: int


def user_tasks_left(need: int, root: Path = Path("/"), given: Given | None = None) -> Fit:
    """How many more threads this process may start before ``ulimit -u`` refuses one, where
    ``need`` more are wanted: on Linux, RLIMIT_NPROC counts every thread of every process
    whose real user is this one (macOS counts processes, not threads). Root is never
    refused; root inside a user namespace (rootless Podman, LXC) is, and is counted. The
    soft limit is first raised to the hard one. ``given`` and ``root``: a test's limit and
    user, and its /proc.

    The user's threads are counted by a walk of /proc only where ``need`` might not fit:
    the machine's threads of every user (``/proc/loadavg``'s fourth field) are an upper
    bound that is read at once. Inside a container without a user namespace the kernel
    also counts the user's threads outside it, which its /proc does not show: those are
    taken as the user's too (every thread the machine has that /proc does not list)."""
    if given is None:
        if not sys.platform.startswith("linux"):
            return Fit(sys.maxsize)
        import resource  # POSIX only

        if _exempt(root):
            return Fit(sys.maxsize)
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
                soft = hard
        if soft == resource.RLIM_INFINITY:
            return Fit(sys.maxsize)
        given = Given(soft, os.getuid())
    everyone = _threads_now(root)
    if everyone is None:
        return Fit(sys.maxsize)  # no /proc to count with: nothing known, nothing cut
    if given.limit - everyone >= need:
        return Fit(given.limit - everyone, USER_TASKS)  # at least that much: enough
    mine, listed = _threads_of(root / "proc", given.uid)
    # The machine's count again, after the walk: a thread that began or ended while the
    # walk ran is in one count and not the other, and the smaller leaves it out (on a
    # loaded machine, nine threads of other processes were taken for unseen ones).
    unseen = max(0, min(everyone, _threads_now(root) or everyone) - listed)
    return Fit(max(0, given.limit - mine - unseen), USER_TASKS)


def _threads_now(root: Path) -> int | None:
    """The machine's threads of every user now (/proc/loadavg's fourth field), or None."""
    try:
        return int((root / "proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return None


def _exempt(root: Path) -> bool:
    """Whether ``ulimit -u`` binds nobody here: the kernel lets uid 0 of the first user
    namespace past it (kernel/fork.c, INIT_USER), not uid 0 of another one."""
    if os.getuid() != 0:
        return False
    try:
        first = (root / "proc/self/uid_map").read_text().split()
    except OSError:  # no user namespaces in this kernel: root is root
        return True
    return first[:3] == ["0", "0", "4294967295"]


def _threads_of(proc: Path, uid: int) -> tuple[int, int]:
    """The threads of every process whose real user is ``uid``, and of every process
    listed, from /proc/PID/status (bytes: a process's name need not be UTF-8)."""
    mine = listed = 0
    for status in proc.glob("[0-9]*/status"):
        try:
            fields = dict(line.split(b":", 1) for line in status.read_bytes().splitlines()
                          if line.startswith((b"Uid:", b"Threads:")))
            threads = int(fields[b"Threads"])
            listed += threads
            if int(fields[b"Uid"].split()[0]) == uid:
                mine += threads
        except (OSError, KeyError, ValueError, IndexError):  # gone meanwhile, or unreadable
            continue
    return mine, listed


def tasks_left(need: int, root: Path = Path("/")) -> Fit:
    """The tighter of :func:`threads_left` and :func:`user_tasks_left`, said as what
    sets it."""
    cgroup = threads_left(root)
    user = user_tasks_left(need, root)
    if user.n < cgroup.n:
        return user
    return Fit(cgroup.n, f"the cgroup's limit ({cgroup.by})" if cgroup.by else "")


def _room(cgroup: Path) -> int | None:
    """``pids.max`` less ``pids.current`` of one cgroup; None where it sets no limit."""
    try:
        most = (cgroup / "pids.max").read_text().strip()
        now = int((cgroup / "pids.current").read_text())
    except (OSError, ValueError):  # no pids controller there
        return None
    return None if most == "max" else max(0, int(most) - now)


class Fits(NamedTuple):
    """A run's fit: the hosts in flight at once, and the connections a watch keeps."""

    forks: Fit
    kept: Fit


def fit_run(forks: int, hosts_kept: int = 0, root: Path = Path("/")) -> Fits:
    """How many hosts may be in flight at once (``forks``, at least one) and how many of
    ``hosts_kept`` hosts' connections a watch may keep between refreshes beside them:
    each what the limits on open files and threads allow, read once. The hosts in flight
    come first; the connections kept have what is left."""
    soft = raise_soft(SPARE + forks * PER_HOST + hosts_kept * PER_KEPT)
    threads = tasks_left(THREAD_SPARE + forks * THREADS_PER_HOST
                         + hosts_kept * THREADS_PER_KEPT, root)
    files, tasks = soft - SPARE, threads.n - THREAD_SPARE
    flight = _fit(forks, 1, [(files // PER_HOST, FILES),
                             (tasks // THREADS_PER_HOST, threads.by)])
    kept = _fit(hosts_kept, 0, [
        ((files - flight.n * PER_HOST) // PER_KEPT, FILES),
        ((tasks - flight.n * THREADS_PER_HOST) // THREADS_PER_KEPT, threads.by)])
    return Fits(flight, kept)


def fit_forks(forks: int, root: Path = Path("/")) -> Fit:
    """How many hosts may be in flight at once: ``forks``, or as many as the limits on
    open files and threads allow (at least one)."""
    return fit_run(forks, 0, root).forks


def _fit(wanted: int, least: int, bounds: list[tuple[int, str]]) -> Fit:
    """``wanted``, or the tightest of ``bounds`` (each a count and what sets it), at least
    ``least``.

    >>> _fit(64, 1, [(100, "files"), (9, "threads")]), _fit(8, 1, [(100, "files")])
    (Fit(n=9, by='threads'), Fit(n=8, by=''))
    """
    fit = Fit(wanted)
    for n, by in bounds:
        if n < fit.n:
            fit = Fit(max(least, n), by)
    return fit
