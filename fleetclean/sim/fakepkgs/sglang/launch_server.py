"""Fake ``python3 -m sglang.launch_server``: a server process with one worker per GPU.

The process tree matches a real tensor-parallel server: the server (``python3 -m
sglang.launch_server ...``, holding no GPU) has children ``sglang::scheduler_TP0..N-1``,
each holding its ``/dev/nvidiaN``, and ``sglang::detokenizer``, holding none.

On SIGTERM the server passes SIGTERM on to its workers and exits at once, without waiting:
the workers outlive it by their teardown delay (~0.1 s, a CUDA context being freed), so a
cleaner that only watches the server declares victory too early.

Configured by the simulator through the environment, so that the command line stays the
real one: ``FLEETCLEAN_SIM_GPUS`` (``0,1,...``), ``FLEETCLEAN_SIM_GPU_MIB`` (per worker),
``FLEETCLEAN_SIM_PROGRAMS`` (path of ``programs.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping


def start_worker(programs: str, spec: Mapping[str, object], env: dict[str, str]) -> int:
    text = json.dumps(spec)
    argv = [sys.executable, programs, text.ljust(len(text) + 32)]
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    return pid


def _open_ready_path() -> None:
    # As programs.open_ready_path: a supervisor started us, readiness goes to a FIFO.
    path = os.environ.pop("FLEETCLEAN_SIM_READY_PATH", None)
    if path is None or "FLEETCLEAN_SIM_READY_FD" in os.environ:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.set_blocking(fd, True)
    os.set_inheritable(fd, True)
    os.environ["FLEETCLEAN_SIM_READY_FD"] = str(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--model-path", default="")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--port", type=int, default=30000)
    parser.parse_known_args(argv)
    _open_ready_path()
    gpus = [int(g) for g in os.environ.get("FLEETCLEAN_SIM_GPUS", "0").split(",") if g]
    programs = os.environ["FLEETCLEAN_SIM_PROGRAMS"]
    # Auto-reap: a worker killed on its own must not linger as a zombie child.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    workers: list[int] = []
    for rank, gpu in enumerate(gpus):
        title = f"sglang::scheduler_TP{rank}"
        spec = {
            "role": "holder",
            "title": title,
            "comm": title,
            "gpus": [gpu],
            "setproctitle": True,
        }
        workers.append(start_worker(programs, spec, dict(os.environ)))
    detokenizer = {
        "role": "holder",
        "title": "sglang::detokenizer",
        "comm": "sglang::detoken",
        "setproctitle": True,
    }
    env = dict(os.environ)
    env.pop("FLEETCLEAN_SIM_GPU_MIB", None)
    workers.append(start_worker(programs, detokenizer, env))

    def on_term(signum: int, frame: object) -> None:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    ready = os.environ.pop("FLEETCLEAN_SIM_READY_FD", None)
    if ready is not None:
        os.write(int(ready), f"{os.readlink('/proc/self')}\n".encode())
        os.close(int(ready))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
