"""A node's stuck driver: a FUSE file system whose answers come late, or never.

A process that waits on a driver request the kernel cannot cancel is in state D and
survives SIGKILL until the request ends; a killed process whose device release takes time
sits in its exit (address space gone, so ``/proc/PID/cmdline`` reads empty) before it
becomes a zombie. Both need the kernel's own waits, so the simulator makes them with
FUSE, where this daemon is the "driver" that answers:

- ``hang-ID``: a lookup of such a name is never answered (one name per waiter: the kernel
  makes a second lookup of a name wait, unkillably, behind the first). The caller sleeps
  in the request; once SIGKILL arrives the kernel waits for the answer uninterruptibly
  (state D) and the process lives on, holding its devices, until ``unstick`` (SIGUSR1
  here: every held request fails with EIO) or this daemon ends (the connection is
  aborted).
- ``exit-MS``: a file that opens at once and whose flush (every close, so also the one in
  the owner's exit) is answered MS milliseconds late. The kernel always waits out a flush,
  so a killed owner spends MS in its exit, after its memory and its earlier files are
  released, before it becomes a zombie.

Runs inside a node as ``python3 stuckfs.py MOUNTPOINT`` (standard library only), started
by ``launcher.py`` the first time a workload needs it, and dies with the node: its
``/dev/fuse`` descriptor is close-on-exec and never inherited, so its end aborts the
connection and frees every waiter. Protocol: ``include/uapi/linux/fuse.h``.

>>> len(attr(1, DIR_MODE)), len(entry(2, FILE_MODE))
(88, 128)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import struct
import sys
import threading
import time

PID_FILE = "/run/fleetclean-stuckfs.pid"
MOUNTPOINT = "/run/fleetclean-stuck"
DIR_MODE = 0o040755
FILE_MODE = 0o100644
LOOKUP, FORGET, GETATTR, OPEN, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 18, 25, 26
INTERRUPT, DESTROY, BATCH_FORGET = 36, 38, 42
PARALLEL_DIROPS = 1 << 18
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, ...
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
NO_REPLY = (FORGET, INTERRUPT, BATCH_FORGET)
MS_NOSUID, MS_NODEV = 2, 4


def attr(ino: int, mode: int) -> bytes:
    """struct fuse_attr: ino, size, blocks, a/m/ctime (+nsec), mode, nlink, uid, gid, rdev,
    blksize, flags."""
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 0, 0, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0,
                       4096, 0)


def entry(ino: int, mode: int) -> bytes:
    """struct fuse_entry_out: nodeid, generation, entry/attr validity (0: ask again), attr."""
    return struct.pack("<QQQQII", ino, 0, 0, 0, 0, 0) + attr(ino, mode)


class StuckFs:
    """The daemon: names to node ids, and the requests it holds back."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.names: dict[str, int] = {}
        self.delay_ms: dict[int, int] = {}
        self.held: list[int] = []  # unique ids of the hang lookups

    def reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        header = OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique)
        # ENOENT: the waiter is gone (interrupted); ENODEV: the connection was aborted.
        with self.lock, contextlib.suppress(OSError):
            os.write(self.fd, header + body)

    def lookup(self, unique: int, name: str) -> None:
        if name.startswith("hang"):
            self.held.append(unique)
            return
        if not (name.startswith("exit-") and name[5:].isdigit()):
            self.reply(unique, errno.ENOENT)
            return
        ino = self.names.setdefault(name, len(self.names) + 2)
        self.delay_ms[ino] = int(name[5:])
        self.reply(unique, body=entry(ino, FILE_MODE))

    def handle(self, opcode: int, unique: int, nodeid: int, body: bytes) -> None:
        if opcode == INIT:
            major, minor, readahead, _ = struct.unpack_from("<IIII", body)
            # fuse_init_out (64 bytes, as 7.23+ expects) with one feature: parallel
            # directory operations, or a held lookup would hold the directory's lock and
            # every other lookup there would wait behind it.
            out = struct.pack("<IIIIHHIIHHII", major, minor, readahead, PARALLEL_DIROPS, 16,
                              12, 1 << 17, 1, 32, 0, 0, 0) + b"\0" * 24
            self.reply(unique, body=out)
        elif opcode == LOOKUP:
            self.lookup(unique, body.split(b"\0", 1)[0].decode(errors="replace"))
        elif opcode == GETATTR:
            mode = DIR_MODE if nodeid == 1 else FILE_MODE
            self.reply(unique, body=struct.pack("<QII", 0, 0, 0) + attr(nodeid, mode))
        elif opcode == OPEN:
            self.reply(unique, body=struct.pack("<QIi", 0, 0, 0))
        elif opcode == FLUSH:
            delay = self.delay_ms.get(nodeid, 0) / 1000
            threading.Timer(delay, self.reply, (unique,)).start()
        elif opcode == RELEASE:
            self.reply(unique)
        elif opcode not in NO_REPLY:
            self.reply(unique, errno.ENOSYS)

    def unstick(self, *_: object) -> None:
        held, self.held = self.held, []
        for unique in held:
            self.reply(unique, errno.EIO)

    def serve(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1 << 20)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(data)
            if opcode == DESTROY:
                return
            self.handle(opcode, unique, nodeid, data[IN_HEADER.size :])


def mount(fd: int, target: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    if libc.mount(b"fleetclean-stuck", target.encode(), b"fuse", MS_NOSUID | MS_NODEV,
                  options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount fuse on {target}: {os.strerror(err)}")


def start(target: str = MOUNTPOINT) -> None:
    """Mount and serve in this process (the caller double-forked it into the node)."""
    os.makedirs(target, exist_ok=True)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    mount(fd, target)
    fs = StuckFs(fd)
    signal.signal(signal.SIGUSR1, fs.unstick)
    with open(PID_FILE, "w") as f:
        f.write(f"{os.getpid()}\n")
    fs.serve()


def running() -> bool:
    """True while the daemon of the PID file lives (mounting twice would stack a second
    file system on the first, and the mount waits on the first's root for ever)."""
    try:
        with open(PID_FILE) as f:
            os.kill(int(f.read()), 0)
    except (OSError, ValueError):
        return False
    return True


def ready(target: str = MOUNTPOINT, timeout: float = 10.0) -> bool:
    """True once the file system answers (an ``exit-0`` lookup succeeds)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.stat(os.path.join(target, "exit-0"))
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


if __name__ == "__main__":
    start(sys.argv[1] if len(sys.argv) > 1 else MOUNTPOINT)
