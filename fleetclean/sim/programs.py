"""The processes a simulated workload is made of: GPU holders, agents, writers, supervisors.

Runs inside a node as ``python3 programs.py SPEC_JSON`` (standard library only, never
imported through the package). SPEC_JSON is padded with spaces so that the argv area is
long enough to be overwritten by the process title, the way setproctitle(3) does it: after
start-up ``/proc/PID/cmdline`` reads exactly ``spec["title"]`` (``sglang::scheduler_TP3``,
``python3 /opt/monitor/agent.py`` ...) and ``/proc/PID/comm`` reads ``spec["comm"]``.

Spec keys (all optional but ``role``):

- ``role``: ``holder`` (open devices, sleep), ``writer`` (keep ``path`` open for writing),
  ``supervisor`` (re-run ``child`` spec within ~100 ms whenever it dies).
- ``gpus``: GPU indexes whose ``/dev/nvidiaN`` to hold; ``ctl``: also hold
  ``/dev/nvidiactl`` and ``/dev/nvidia-uvm`` (``ctl_only`` holds nvidiactl alone).
- ``on_term``: ``exit`` after ``delay`` seconds (default 0.1, a CUDA teardown), or
  ``ignore``.

Readiness: when ``FLEETCLEAN_SIM_READY_FD`` names an inherited pipe, the process writes its
PID there once its devices are open and closes it; the launcher waits for that.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

# Run as a script: the sibling module is found through sys.path[0], not the package.
from proctitle import set_title  # type: ignore[import-not-found]

READY_FD = "FLEETCLEAN_SIM_READY_FD"


def report_ready() -> None:
    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return
    try:
        os.write(int(fd), f"{os.getpid()}\n".encode())
        os.close(int(fd))
    except OSError:
        pass


def open_devices(spec: dict[str, Any]) -> list[int]:
    paths = [f"/dev/nvidia{i}" for i in spec.get("gpus", [])]
    if spec.get("ctl") or spec.get("gpus"):
        paths += ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    if spec.get("ctl_only"):
        paths = ["/dev/nvidiactl"]
    return [os.open(p, os.O_RDWR) for p in paths]


def install_term(spec: dict[str, Any]) -> None:
    policy = spec.get("on_term", "exit")
    if policy == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return
    delay = float(spec.get("delay", 0.1))

    def on_term(signum: int, frame: object) -> None:
        time.sleep(delay)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)


def supervise(spec: dict[str, Any]) -> None:
    """Restart the child spec whenever it dies: the thing that makes a host 'dirty' again
    100 ms after it was cleaned."""
    child_argv = [sys.executable, os.path.abspath(__file__), pad(spec["child"])]
    env = dict(os.environ)
    while True:
        pid = os.fork()
        if pid == 0:
            os.execve(sys.executable, child_argv, env)
        fd = env.pop(READY_FD, None)
        if fd is not None:
            os.close(int(fd))
        os.waitpid(pid, 0)
        time.sleep(0.05)


def pad(spec: dict[str, Any]) -> str:
    """SPEC_JSON padded so that the title fits in the argv area (see set_title)."""
    text = json.dumps(spec)
    return text.ljust(max(len(text), len(spec.get("title", ""))) + 16)


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[1])
    set_title(spec.get("title", "python3"), spec.get("comm", "python3"))
    role = spec["role"]
    if role == "supervisor":
        # The supervisor reports itself; its first child reports through the same pipe.
        fd = os.environ.get(READY_FD)
        if fd is not None:
            os.write(int(fd), f"{os.getpid()}\n".encode())
        supervise(spec)
        return 0
    install_term(spec)
    held = open_devices(spec)
    if role == "writer":
        path = spec["path"]
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        out = open(path, "ab")  # noqa: SIM115 - held open for the life of the process
        out.write(b"hidden states\n")
        out.flush()
        held.append(out.fileno())
    report_ready()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
