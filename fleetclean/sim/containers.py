"""What the simulated container runtimes share (``dockerd.py``, ``kubelet.py``): a shim per
start, a container init in its own PID namespace and cgroup, processes exec'd beside it,
and docker's words for time.

Runs inside a node (standard library only, a sibling module). A start forks a shim (titled
``/usr/bin/containerd-shim-runc-v2 -namespace NS -id ID -address ...``, as on a real node
its parent); the shim unshares a PID namespace and forks the container's init, which
joins the container's cgroup and execs the command. The shim waits for it and exits with
docker's exit code (the init's status, or 128 + the signal that killed it). As in a real
container the init is PID 1 of its namespace: a signal it has no handler for is ignored
(so ``docker stop`` waits out its timeout for a process that never handles SIGTERM), and
when it dies the kernel kills the rest of the container.

``docker exec`` (``exec_socket``): the shim listens on a unix socket, named as containerd
names a shim's (:func:`shim_socket`), and forks each command it is sent into the
container's PID namespace and cgroup, as runc exec does: the process's parent is the shim,
not the container's init, and nothing starts it again when it dies. A request is one JSON
line, ``{"argv", "env", "cwd", "detach"}``, with the client's stdin, stdout and stderr
passed along (SCM_RIGHTS); the answer is ``{"pid": N}`` (node PID), then, unless detached,
``{"exit": CODE}`` when it ends; or ``{"error": TEXT, "code": 126|127}`` when the command
cannot start. A client that goes away before the end of a process it waits for gets it a
SIGTERM, as dockerd sends one when the CLI's attach ends.

>>> human_duration(0.4), human_duration(1), human_duration(75), human_duration(7300)
('Less than a second', '1 second', 'About a minute', '2 hours')
>>> backoff(0), backoff(3), backoff(20)
(0.1, 0.8, 60.0)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, NoReturn

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
SHIM_SOCKETS = "/run/containerd/s"
ZERO_TIME = "0001-01-01T00:00:00Z"


def new_id() -> str:
    """A container id: 64 lowercase hex digits, as runc's."""
    return secrets.token_hex(32)


def shim_socket(namespace: str, cid: str, address: str = CONTAINERD_SOCK,
                folder: str = SHIM_SOCKETS) -> str:
    """Where the shim of container ``cid`` takes exec requests: containerd's
    ``/run/containerd/s/HEX``, HEX the sha256 of its address, the namespace and the id (a
    rootless daemon's containerd: its own address, and a folder of the user's)."""
    key = f"{address}/{namespace}/{cid}"
    return os.path.join(folder, hashlib.sha256(key.encode()).hexdigest())


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


def ps_status(state: str, exit_code: int, started_at: float, finished_at: float,
              now: float) -> str:
    """``ps``'s STATUS of a container in STATE at NOW, as docker and podman word it (``Up 5
    seconds``, ``Exited (0) About a minute ago``)."""
    if state == "running":
        return "Up " + human_duration(now - started_at)
    if state == "restarting":
        return f"Restarting ({exit_code}) {human_duration(now - finished_at)} ago"
    if state == "exited":
        return f"Exited ({exit_code}) {human_duration(now - finished_at)} ago"
    return "Created"


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
    exec_socket: str = "",
) -> tuple[int, int]:
    """Fork a shim that runs ``argv`` as a container init in cgroup ``cgroup`` (one path
    in every hierarchy; "": the shim's own) and, given ``exec_socket``, execs commands
    beside it;
    ``on_exit(exit_code)`` when it is gone. Returns (shim pid, init pid, as the node sees
    it)."""
    tree = nodecg.Tree.load()
    rfd, wfd = os.pipe()

    def shim() -> None:
        os.close(rfd)
        run_shim(argv, env, cgroup, title=shim_title, tree=tree, report=wfd,
              exec_socket=exec_socket)

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


def run_shim(argv: list[str], env: dict[str, str], cgroup: str, *, title: str,
          tree: nodecg.Tree, report: int, exec_socket: str, comm: str = "containerd-shim",
          on_end: Callable[[int], None] | None = None) -> None:
    """The shim process: subreaper, new PID namespace, the init, its exit code. Podman's
    conmon (``conmon.py``) is the same monitor under another name (``comm``), which runs
    its exit command (``on_end(exit_code)``) before it exits."""
    os.setsid()
    set_plain_title(title, comm)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
    shim = _Shim(cgroup, tree, exec_socket, on_end)
    # Listening before the start is reported: an exec right after `docker run` finds it.
    if exec_socket:
        shim.listen()

    def init() -> None:
        os.close(report)
        null = os.open("/dev/null", os.O_RDWR)
        try:
            _become(argv, env, cgroup, tree, stdio=(null, null, null), cwd="/")
        except OSError:
            os._exit(127)  # as docker: a command that cannot start exits 127

    # The shim is in the node's PID namespace: fork gave the init's PID there.
    pid = shim.loop.spawn(init, shim.init_ended)
    os.write(report, f"{pid}\n".encode())
    os.close(report)
    shim.loop.run()


def _become(argv: list[str], env: dict[str, str], cgroup: str, tree: nodecg.Tree, *,
            stdio: tuple[int, int, int], cwd: str, path: str = "") -> None:
    """In a child of the shim: a process of the container (its own session, the
    container's cgroup, ``stdio`` as 0, 1, 2), then ``argv`` (the program at ``path``, else
    at ``argv[0]``); OSError if that fails."""
    os.setsid()
    if cgroup:
        tree.place(0, nodecg.everywhere(cgroup))
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    os.chdir(cwd)
    os.execve(path or argv[0], argv, env)


class _Shim:
    """The shim's loop (daemonkit's): reap its children (the init, exec'd processes),
    answer exec requests; exit with the init's exit code when the init is gone."""

    def __init__(self, cgroup: str, tree: nodecg.Tree, path: str,
                 on_end: Callable[[int], None] | None = None) -> None:
        self.cgroup, self.tree, self.path, self.on_end = cgroup, tree, path, on_end
        self.loop = daemonkit.Loop()
        self.waiting: dict[int, socket.socket] = {}  # exec'd pid -> the client waiting for it

    def listen(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a shim killed before it could remove it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        self.loop.listeners.append(listener)  # closed in every child the loop forks
        self.loop.sel.register(listener, selectors.EVENT_READ, lambda _: self.accept(listener))

    def init_ended(self, status: int) -> NoReturn:
        # The kernel killed the rest of the container before the init could go.
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self.on_end is not None:
            self.on_end(_shim_code(status))
        os._exit(_shim_code(status))

    def exec_ended(self, pid: int, status: int) -> None:
        conn = self.waiting.pop(pid, None)
        if conn is not None:
            self.loop.sel.unregister(conn)
            _send(conn, {"exit": _shim_code(status)})
            conn.close()

    def client_left(self, pid: int, conn: socket.socket) -> None:
        if _recv_some(conn) or self.waiting.get(pid) is not conn:
            return
        # The client left (a killed `docker exec`): dockerd TERMs its process.
        del self.waiting[pid]
        self.loop.sel.unregister(conn)
        conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    def accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.settimeout(5)
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
            while not data.endswith(b"\n"):
                more = conn.recv(65536)
                if not more:
                    break
                data += more
            req = json.loads(data)
            if len(fds) != 3:
                raise ValueError("three descriptors wanted: stdin, stdout, stderr")
            answer = self.start(req, fds)
        except (OSError, ValueError) as exc:
            answer = {"error": f"bad exec request: {exc}", "code": 126}
        finally:
            for fd in fds:
                os.close(fd)
        _send(conn, answer)
        if "pid" in answer and not req.get("detach"):
            pid = answer["pid"]
            self.waiting[pid] = conn
            self.loop.sel.register(conn, selectors.EVENT_READ,
                                   lambda _: self.client_left(pid, conn))
        else:
            conn.close()

    def start(self, req: dict[str, Any], stdio: list[int]) -> dict[str, Any]:
        """Fork ``req["argv"]`` into the container, as runc exec: found in the PATH of its
        own environment; {"pid"} once it runs, or {"error", "code"} as docker says it."""
        argv = [str(a) for a in req["argv"]]
        env = dict(str(e).partition("=")[::2] for e in req["env"])
        path = shutil.which(argv[0], path=env.get("PATH", "")) if "/" not in argv[0] \
            else argv[0]
        if path is None:
            return _exec_failed(f'exec: "{argv[0]}": executable file not found in $PATH', 127)
        # Closed by a good execve (close-on-exec); else the child writes its errno there.
        err_r, err_w = os.pipe()

        def child() -> None:
            os.close(err_r)
            try:
                # argv[0] as given, the program found in the PATH (runc's LookPath).
                _become(argv, env, self.cgroup, self.tree, path=path,
                        stdio=(stdio[0], stdio[1], stdio[2]), cwd=str(req.get("cwd") or "/"))
            except OSError as exc:
                os.write(err_w, str(exc.errno or errno.EIO).encode())

        # Reaped by the loop; one that never ran ends with the code docker gives it.
        pid = self.loop.spawn(child, lambda status: self.exec_ended(pid, status))
        os.close(err_w)
        with os.fdopen(err_r, "rb") as f:
            failed = f.read()
        if not failed:
            return {"pid": pid}
        number = int(failed)
        words = os.strerror(number).lower()
        if number == errno.ENOENT:
            return _exec_failed(f'exec: "{argv[0]}": stat {path}: {words}', 127)
        return _exec_failed(f'exec: "{argv[0]}": {words}', 126)


def _exec_failed(why: str, code: int) -> dict[str, Any]:
    return {"error": "OCI runtime exec failed: exec failed: unable to start container "
                     f"process: {why}: unknown", "code": code}


def _recv_some(conn: socket.socket) -> bool:
    """False when the peer has closed its end."""
    try:
        return bool(conn.recv(512, socket.MSG_DONTWAIT))
    except BlockingIOError:
        return True
    except OSError:
        return False


def _send(conn: socket.socket, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(answer).encode() + b"\n")
