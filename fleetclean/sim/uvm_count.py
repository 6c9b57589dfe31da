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
import time

if __package__:
    from fleetclean.sim import smi_driver, smi_state
else:  # run as a script: the sibling modules are found through sys.path[0]
    import smi_driver  # type: ignore[import-not-found,no-redef]
    import smi_state  # type: ignore[import-not-found,no-redef]

SOCKET = "/run/fleetclean-uvm.sock"
MODULES = "/sys/module"
REFCNT = "/sys/module/nvidia_uvm/refcnt"
DEVICE = "/dev/nvidia-uvm"
TIMEOUT_S = 10.0
RETRY_MS = 1000


def holders() -> set[int]:
    """The PIDs of the node's processes with /dev/nvidia-uvm open (a process whose main
    thread has exited while another lives is read through that one's task)."""
    return {pid for pid, _, targets in smi_state.open_files() if DEVICE in targets}


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
    server = smi_driver.listener(path)
    write(refcnt, 0)
    poller = select.poll()
    poller.register(server, select.POLLIN)
    watched: dict[int, int] = {}  # pidfd -> PID
    # Counted without a pidfd (none could be had: no descriptor left): nothing would say
    # when they end, so the loop counts again every RETRY_MS while there are any.
    unwatched: set[int] = set()

    def recount() -> None:
        found = holders()
        unwatched.clear()
        for pid in found - set(watched.values()):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:  # reaped since the scan: its files are closed
                found.discard(pid)
                continue
            except OSError as exc:
                print(f"uvm_count: no pidfd for {pid}: {exc!r}", file=sys.stderr, flush=True)
                unwatched.add(pid)
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
            events = poller.poll(RETRY_MS if unwatched else None)
            if not events:
                events = [(-1, 0)]  # a recount for the unwatched
            for fd, _ in events:
                # One event that fails (a full disk, no descriptor left) must not end the
                # thread: the count would stay as it is for the node's life, and a program
                # that says it opened the device would wait TIMEOUT_S on a socket nobody
                # accepts on. It is said in the init's log, and the next event counts anew;
                # a pause first, or an accept that keeps failing would spin.
                try:
                    recount() if fd == -1 else event(fd)
                except Exception as exc:
                    print(f"uvm_count: {exc!r}", file=sys.stderr, flush=True)
                    time.sleep(RETRY_MS / 1000)

    thread = threading.Thread(target=loop, name="uvm-count", daemon=True)
    thread.start()
    return thread


# What a test's own stand-in for a CUDA process (a ``python3 -c`` line in a node) runs once
# its files are open: :func:`opened` in one line of Python, without a quote (the lines sit
# inside shell quotes of either kind), and without failing where no init answers (a
# container's own /run: connect_ex says so instead of raising) or answers late (select
# gives up after TIMEOUT_S, where recv would raise).
OPENED_PY = (f"import select, socket; c = socket.socket(socket.AF_UNIX); "
             f"c.connect_ex(bytes({tuple(SOCKET.encode())})) or "
             f"select.select([c], [], [], {TIMEOUT_S})[0] and c.recv(1); c.close()")


def opened(path: str = SOCKET) -> None:
    """Tell the node's init that this process opened /dev/nvidia-uvm; returns once its
    file counts it (at once where there is no such init: outside a node)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(TIMEOUT_S)
        conn.connect(path)
        while conn.recv(64):
            pass
