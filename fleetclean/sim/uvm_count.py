"""A node's ``/sys/module/nvidia_uvm/refcnt``: how many processes hold /dev/nvidia-uvm.

On a real node the kernel takes a reference on the nvidia_uvm module for every open file of
/dev/nvidia-uvm (its ``file_operations`` name the module as their owner), and sysfs shows
the count. Every CUDA process opens that device when CUDA starts; nvidia-smi,
nvidia-persistenced and other NVML readers never do. So the file says, in one read(2) and
without asking the driver, whether any process on the node may hold a GPU context: a
status script reads it to pick its GPU read (``render.early_reads``): ``--query-gpu``
where nothing does, ``-q`` with the processes where something does.

The simulated node's file is kept by its init (:func:`serve`, one thread), on a tmpfs over
the node's own /sys/module: rewritten whenever a simulated program says it opened the
device (:func:`opened`, which returns once the file counts it) and whenever a process that
held it ends (a pidfd per holder), from a scan of every process's descriptors. It counts
processes, where the kernel counts open files (a child sharing its parent's file counts
once more here): fleetclean only reads whether it is 0. Standard library only; a sibling
of ``node_init`` inside nodes.

>>> import tempfile
>>> where = tempfile.mkdtemp()
>>> write(where + "/refcnt", 3)
>>> open(where + "/refcnt").read()
'3\\n'
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading

SOCKET = "/run/fleetclean-uvm.sock"
MODULES = "/sys/module"
REFCNT = "/sys/module/nvidia_uvm/refcnt"
DEVICE = "/dev/nvidia-uvm"
TIMEOUT_S = 10.0


def holders() -> set[int]:
    """The PIDs of the node's processes with /dev/nvidia-uvm open (a process whose main
    thread has exited while another lives is read through that one's task)."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        try:
            fds = os.listdir(f"{base}/fd")
            if not fds:
                tids = [t for t in os.listdir(f"{base}/task") if t != pid]
                if not tids:
                    continue
                base = f"{base}/task/{tids[0]}"
                fds = os.listdir(f"{base}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"{base}/fd/{fd}") == DEVICE:
                    found.add(int(pid))
                    break
    return found


def write(path: str, count: int) -> None:
    """``path`` holds ``count``, replaced whole (a reader never sees it half written)."""
    new = f"{path}.new"
    with open(new, "w") as f:
        f.write(f"{count}\n")
    os.rename(new, path)


def serve(path: str = SOCKET, refcnt: str = REFCNT) -> threading.Thread:
    """Keep ``refcnt`` current in a daemon thread: 0 now, recounted at each connection on
    ``path`` (answered, by closing it, once the file counts what is open) and at each
    counted holder's end. The socket is bound before this returns; any account may
    connect (mode 0666)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(64)
    write(refcnt, 0)
    poller = select.poll()
    poller.register(server, select.POLLIN)
    watched: dict[int, int] = {}  # pidfd -> PID

    def recount() -> None:
        found = holders()
        for pid in found - set(watched.values()):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:  # reaped since the scan: its files are closed
                found.discard(pid)
                continue
            except OSError as exc:  # no descriptor left: counted, watched at the next event
                print(f"uvm_count: no pidfd for {pid}: {exc!r}", file=sys.stderr, flush=True)
                continue
            watched[fd] = pid
            poller.register(fd, select.POLLIN)
        write(refcnt, len(found))

    def event(fd: int) -> None:
        if fd == server.fileno():
            conn, _ = server.accept()
            with conn:
                recount()
            return
        poller.unregister(fd)
        os.close(fd)
        watched.pop(fd, None)
        recount()

    def loop() -> None:
        while True:
            for fd, _ in poller.poll():
                # One event that fails (a full disk, a descriptor gone) must not end the
                # thread: the count would stay as it is for the node's life, and a program
                # that says it opened the device would wait TIMEOUT_S on a socket nobody
                # accepts on. It is said in the init's log, and the next event counts anew.
                try:
                    event(fd)
                except Exception as exc:
                    print(f"uvm_count: {exc!r}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=loop, name="uvm-count", daemon=True)
    thread.start()
    return thread


# What a test's own stand-in for a CUDA process (a ``python3 -c`` line in a node) runs once
# its files are open: :func:`opened` in one line of Python, without a quote (the lines sit
# inside shell quotes of either kind), and without failing where no init answers (a
# container's own /run): connect_ex says so instead of raising.
OPENED_PY = (f"import socket; c = socket.socket(socket.AF_UNIX); c.settimeout({TIMEOUT_S}); "
             f"c.connect_ex(bytes({tuple(SOCKET.encode())})) or c.recv(1); c.close()")


def opened(path: str = SOCKET) -> None:
    """Tell the node's init that this process opened /dev/nvidia-uvm; returns once its
    file counts it (at once where there is no such init: outside a node)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(TIMEOUT_S)
        conn.connect(path)
        while conn.recv(64):
            pass
