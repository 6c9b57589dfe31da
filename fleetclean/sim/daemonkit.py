"""What every simulated supervisor daemon is made of: one event loop, a control socket,
children, timers. Runs inside a node (standard library only, a sibling module).

A daemon (``svcmgr``, ``dockerd``, ``kubelet``) is single-threaded, so it may fork at any
time: a :class:`Loop` multiplexes its control socket (one JSON request per connection,
answered with one JSON line, possibly later: ``systemctl stop`` waits for the unit to
stop), the exits of its children (SIGCHLD through a wakeup pipe) and its timers. Its
command-line tools talk to it with :func:`call`.

Example::

    loop = Loop()
    loop.serve("/run/x.sock", lambda req, reply: reply({"echo": req}))
    loop.after(0.1, lambda: print("tick"))
    loop.run()
    # elsewhere: call("/run/x.sock", {"op": "ping"}) -> {"echo": {"op": "ping"}}
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import itertools
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

Request = dict[str, Any]
Reply = Callable[[dict[str, Any]], None]
Handler = Callable[[Request, Reply], None]
ExitCallback = Callable[[int], None]  # gets the wait status


class Unavailable(Exception):
    """The daemon does not run (nothing listens on its socket)."""


def call(path: str, request: Request, timeout: float | None = None) -> dict[str, Any]:
    """Send one request to the daemon at ``path`` and return its answer; Unavailable when
    no daemon listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise Unavailable(path) from exc
    with sock:
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise Unavailable(path)
    answer: dict[str, Any] = json.loads(data)
    return answer


def ensure_daemon(path: str, argv: list[str], log: str, probe: Request) -> None:
    """Start ``argv`` as a daemon (its own session, output to ``log``, reparented to the
    node's init once the caller exits) unless one answers ``probe`` on ``path``; return
    once it does. A lock file beside the socket makes two callers at once start one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            call(path, probe, timeout=5)
            return
        except Unavailable:
            pass
        with open(log, "ab") as out:
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True, cwd="/")
        wait_socket(path)
    finally:
        os.close(lock)


def wait_socket(path: str, timeout: float = 10.0) -> None:
    """Until something accepts connections on ``path``; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return
        except OSError:
            time.sleep(0.005)
        finally:
            sock.close()
    raise TimeoutError(f"nothing listens on {path} after {timeout:.0f} s")


class Loop:
    """The event loop of one daemon."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.cancelled: set[int] = set()
        self.seq = itertools.count()
        self.children: dict[int, ExitCallback] = {}
        self.listeners: list[socket.socket] = []
        rfd, wfd = os.pipe()
        for fd in (rfd, wfd):
            os.set_blocking(fd, False)
        self.wake_r, self.wake_w = rfd, wfd
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wfd)
        self.sel.register(rfd, selectors.EVENT_READ, self._on_wake)

    # -- timers and children -------------------------------------------------------

    def after(self, delay: float, fn: Callable[[], None]) -> int:
        """Call ``fn`` in ``delay`` seconds; returns a handle for :meth:`cancel`."""
        handle = next(self.seq)
        heapq.heappush(self.timers, (time.monotonic() + delay, handle, fn))
        return handle

    def cancel(self, handle: int | None) -> None:
        if handle is not None:
            self.cancelled.add(handle)

    def spawn(self, child: Callable[[], None], on_exit: ExitCallback) -> int:
        """Fork; the child runs ``child`` (which should exec) with the signal state of a
        fresh process and none of the daemon's descriptors; ``on_exit(status)`` runs when
        it is reaped. Returns its PID."""
        pid = os.fork()
        if pid == 0:
            try:
                self._in_child()
                child()
            except BaseException as exc:  # reported, then the child ends
                print(f"child {os.getpid()} failed: {exc!r}", file=sys.stderr, flush=True)
            finally:
                os._exit(127)
        self.children[pid] = on_exit
        return pid

    def _in_child(self) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        for sock in self.listeners:
            sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _on_wake(self, _: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass
        self._reap()

    def _reap(self) -> None:
        for pid, status in reaped():
            callback = self.children.pop(pid, None)
            if callback is not None:
                callback(status)

    # -- the control socket --------------------------------------------------------

    def serve(self, path: str, handler: Handler) -> None:
        """Answer requests on the unix socket ``path`` with ``handler(request, reply)``.
        OSError (EADDRINUSE) when another daemon already serves it."""
        with contextlib.suppress(FileNotFoundError):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise OSError(errno.EADDRINUSE, f"another daemon serves {path}")
            except ConnectionRefusedError:
                os.unlink(path)
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sock.bind(path)
        sock.listen(64)
        sock.setblocking(False)
        self.listeners.append(sock)
        self.sel.register(sock, selectors.EVENT_READ, lambda _: self._accept(sock, handler))

    def _accept(self, sock: socket.socket, handler: Handler) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = sock.accept()
            conn.setblocking(True)
            conn.settimeout(5)
            try:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                request: Request = json.loads(data or b"{}")
            except (OSError, ValueError):
                conn.close()
                return
            handler(request, _replier(conn))

    # -- running -------------------------------------------------------------------

    def run(self) -> None:
        while True:
            timeout = None
            while self.timers and self.timers[0][1] in self.cancelled:
                self.cancelled.discard(heapq.heappop(self.timers)[1])
            if self.timers:
                timeout = max(0.0, self.timers[0][0] - time.monotonic())
            for key, _ in self.sel.select(timeout):
                key.data(key.fd)
            # A SIGCHLD may arrive between two selects with its byte already read.
            self._reap()
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, handle, fn = heapq.heappop(self.timers)
                if handle in self.cancelled:
                    self.cancelled.discard(handle)
                    continue
                fn()


def _replier(conn: socket.socket) -> Reply:
    done = False

    def reply(answer: dict[str, Any]) -> None:
        nonlocal done
        if done:
            return
        done = True
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode() + b"\n")
        conn.close()

    return reply


def reaped() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child that has ended, without blocking."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def exit_code(status: int) -> tuple[int, int]:
    """(code, signal) of a wait status: (3, 0) for exit 3, (0, 9) for SIGKILL."""
    if os.WIFSIGNALED(status):
        return 0, os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), 0
