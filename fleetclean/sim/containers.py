"""What the simulated container runtimes share (``dockerd.py``, ``kubelet.py``): a shim per
start, a container init in its own PID namespace and cgroup, and docker's words for time.

Runs inside a node (standard library only, a sibling module). A start forks a shim (titled
``/usr/bin/containerd-shim-runc-v2 -namespace NS -id ID -address ...``, as on a real node
its parent); the shim unshares a PID namespace and forks the container's init, which
joins the container's cgroup and execs the command. The shim waits for it and exits with
docker's exit code (the init's status, or 128 + the signal that killed it). As in a real
container the init is PID 1 of its namespace: a signal it has no handler for is ignored
(so ``docker stop`` waits out its timeout for a process that never handles SIGTERM), and
when it dies the kernel kills the rest of the container.

>>> human_duration(0.4), human_duration(1), human_duration(75), human_duration(7300)
('Less than a second', '1 second', 'About a minute', '2 hours')
>>> backoff(0), backoff(3), backoff(20)
(0.1, 0.8, 60.0)
"""

from __future__ import annotations

import ctypes
import os
import secrets
import select
import time
from collections.abc import Callable

if __package__:
    from fleetclean.sim import daemonkit, nodecg
    from fleetclean.sim.proctitle import set_plain_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title  # type: ignore[import-not-found,no-redef]

CLONE_NEWPID = 0x20000000
PR_SET_CHILD_SUBREAPER = 36
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
ZERO_TIME = "0001-01-01T00:00:00Z"


def new_id() -> str:
    """A container id: 64 lowercase hex digits, as runc's."""
    return secrets.token_hex(32)


def iso(t: float) -> str:
    """RFC 3339 with nanoseconds, as docker inspect writes times."""
    if not t:
        return ZERO_TIME
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return f"{whole}.{int((t % 1) * 1e9):09d}Z"


def human_duration(seconds: float) -> str:
    """docker's units.HumanDuration (``Up 5 seconds``, ``Exited (0) About a minute ago``)."""
    s = int(seconds)
    if seconds < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(s / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    return f"{hours // 24} days"


def backoff(failures: int) -> float:
    """docker's restart delay after ``failures`` quick exits in a row: 100 ms, doubling,
    at most a minute (a container that ran 10 s starts over at 100 ms)."""
    return float(min(60.0, 0.1 * 2**failures))


def start(
    loop: daemonkit.Loop,
    *,
    argv: list[str],
    env: dict[str, str],
    cgroup: str,
    shim_title: str,
    on_exit: Callable[[int], None],
) -> tuple[int, int]:
    """Fork a shim that runs ``argv`` as a container init in cgroup ``cgroup`` (one path
    in every hierarchy); ``on_exit(exit_code)`` when it is gone. Returns (shim pid, init
    pid, as the node sees it)."""
    tree = nodecg.Tree.load()
    rfd, wfd = os.pipe()

    def shim() -> None:
        os.close(rfd)
        _shim(argv, env, cgroup, title=shim_title, tree=tree, report=wfd)

    shim_pid = loop.spawn(shim, lambda status: on_exit(_shim_code(status)))
    os.close(wfd)
    try:
        ready, _, _ = select.select([rfd], [], [], 10)
        data = os.read(rfd, 64) if ready else b""
    finally:
        os.close(rfd)
    return shim_pid, int(data.split()[0]) if data.split() else 0


def _shim_code(status: int) -> int:
    code, sig = daemonkit.exit_code(status)
    return 128 + sig if sig else code


def _shim(argv: list[str], env: dict[str, str], cgroup: str, *, title: str,
          tree: nodecg.Tree, report: int) -> None:
    """The shim process: subreaper, new PID namespace, the init, its exit code."""
    os.setsid()
    set_plain_title(title, "containerd-shim")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
    init = os.fork()
    if init == 0:
        try:
            os.close(report)
            os.setsid()
            tree.place(0, nodecg.everywhere(cgroup))
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.chdir("/")
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    # The shim is in the node's PID namespace: fork gave the init's PID there.
    os.write(report, f"{init}\n".encode())
    os.close(report)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == init:
            code, sig = daemonkit.exit_code(status)
            os._exit(128 + sig if sig else code)
