"""Start every node of a fleet from one interpreter: fork, unshare, fork again, run the init.

Run by the host (``fleet.SimFleet.up``) as ``python3 -S -E zygote.py PID_FILE PAD``
(PAD: room in the argv area for the titles of what the inits fork, ``node.ARGV_ROOM``), one
node a line on stdin (``NODE_DIR ADDRESS HOSTNAME PERSISTENCED``, ``1`` or ``0``); standard
library only, run by path. It imports ``node_init`` (and what that imports) once and
freezes the collector's objects (``gc.freeze``), so that the nodes' inits share those
pages copy-on-write, then for each node forks a child that

1. joins the node's cgroups and unshares its cgroup namespace (``nodecg``), then its PID,
   mount and UTS namespaces (``unshare(2)`` through ctypes: Python 3.11 has no
   ``os.unshare``), mount propagation private;
2. forks the node's PID 1, records its host PID in PID_FILE (``PID START_TIME init:NODE``,
   as ``pids.record`` writes: ``fleetclean sim down`` kills by that line) and only then
   lets it go on; reports ``NODE PID`` on stdout and exits.

The init mounts its /proc and runs ``node_init.run``. No process stays between the host and
a node's init (it is reparented to this machine's init, as unshare's child was when
``sim up`` exited); the zygote exits once every node is started. A node that could not be
started is reported as ``NODE !`` with the reason in its ``init.log``; an init whose
recording failed never runs (it exits when its go-pipe closes empty), so nothing runs that
``down`` does not know.

One interpreter and a fork per node instead of ``unshare`` and a fresh interpreter: a
1,000-node fleet's inits cost about a third of the memory and a tenth of the start-up CPU.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import traceback

if __package__:
    from fleetclean.sim import node_init, nodecg
else:  # run as a script: the sibling modules are found through sys.path[0]
    import node_init  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
MS_PRIVATE = 0x40000


def start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


def record(pid_file: str, pid: int, role: str) -> None:
    """One line of the fleet's pid file, appended in one write(2) (O_APPEND: the host and
    the other children write the same file)."""
    line = f"{pid} {start_time(pid)} {role}\n".encode()
    fd = os.open(pid_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def as_init(node_dir: str, address: str, hostname: str, cgroups: dict[str, object] | None,
            *, persistenced: bool, go: int) -> None:
    """In the node's PID 1: wait to be recorded, mount the node's /proc, run the init."""
    if os.read(go, 1) != b"1":
        os._exit(1)  # our parent died before it recorded us: nobody could stop us
    os.close(go)
    node_init.mount("proc", "/proc", "proc",
                    node_init.MS_NOSUID | node_init.MS_NODEV | node_init.MS_NOEXEC)
    node_init.run(node_dir, address, hostname, cgroups, persistenced=persistenced)


def start_node(pid_file: str, report: int, line: str) -> None:
    """The forked child for one node (see the module's doc); never returns."""
    node_dir, address, hostname, want = line.split()
    name = os.path.basename(node_dir)
    status = 1
    try:
        log = os.open(os.path.join(node_dir, "init.log"),
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.setsid()
        cgroups = nodecg.join_and_unshare(node_dir)
        if node_init._libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare: {os.strerror(err)}")
        node_init.mount("none", "/", "", node_init.MS_REC | MS_PRIVATE)
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_write)
                os.close(report)
                as_init(node_dir, address, hostname, cgroups, persistenced=want == "1",
                        go=go_read)
                status = 0
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(status)
        os.close(go_read)
        record(pid_file, pid, f"init:{name}")
        os.write(go_write, b"1")
        os.write(report, f"{name} {pid}\n".encode())
        status = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os.write(report, f"{name} !\n".encode())
    finally:
        os._exit(status)


def main(argv: list[str]) -> int:
    pid_file = argv[1]
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    report = os.dup(1)
    # The shared pages stay shared: objects the collector would otherwise touch (and so
    # copy) in every child are moved out of its reach.
    gc.collect()
    gc.freeze()
    children = []
    for line in lines:
        pid = os.fork()
        if pid == 0:
            start_node(pid_file, report, line)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
