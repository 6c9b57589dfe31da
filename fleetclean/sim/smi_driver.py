"""The node's stand-in for the NVIDIA driver: who holds which GPU, answered to any user.

The real nvidia-smi learns every process's GPU memory from the kernel driver, so a user
sees other users' processes (and root's) in ``--query-compute-apps`` without being able to
read their ``/proc/PID/fd``. A fake that scanned /proc as the calling user would see only
that user's own processes. So the node's init, which is root, serves the scan on a unix
socket (``serve``, one thread of the init), and the fake nvidia-smi run by anyone but root
asks it (``ask``); root scans /proc itself, as the driver would, without the round trip.

Standard library only; a sibling script of ``nvidia_smi`` and ``node_init`` inside nodes.
Wire format: the client connects and reads one JSON list of ``[gpu, pid, mib]`` until EOF.

>>> import tempfile
>>> where = tempfile.mkdtemp()
>>> _ = serve(where + "/driver.sock", lambda: [(3, 41, 20480)])
>>> ask(where + "/driver.sock")
[(3, 41, 20480)]
>>> os.unlink(where + "/driver.sock"); os.rmdir(where)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable

SOCKET = "/run/fleetclean-gpu-driver.sock"
TIMEOUT_S = 10.0

Holders = list[tuple[int, int, int]]


def listener(path: str) -> socket.socket:
    """A unix socket listening on ``path`` (one left there before is replaced) that any
    account may connect to (mode 0666)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(64)
    return server


def serve(path: str, scan: Callable[[], Holders]) -> threading.Thread:
    """Answer every connection on ``path`` with ``scan()``, in a daemon thread; the socket
    is bound before this returns, and any account may connect (mode 0666)."""
    server = listener(path)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    conn.sendall(json.dumps(scan()).encode())
                except OSError:  # the client went away; the next one still gets served
                    continue

    thread = threading.Thread(target=loop, name="gpu-driver", daemon=True)
    thread.start()
    return thread


def ask(path: str = SOCKET) -> Holders:
    """The holders the node's driver stand-in reports; OSError when nobody answers,
    ValueError for an answer that is not one."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(path)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    rows = json.loads(b"".join(chunks))
    return [(int(g), int(p), int(m)) for g, p, m in rows]
