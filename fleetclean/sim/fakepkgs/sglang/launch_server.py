"""Fake ``python3 -m sglang.launch_server``: a server process with one worker per GPU.

The process tree matches a real tensor-parallel server: the server (``python3 -m
sglang.launch_server ...``, holding no GPU) has children ``sglang::scheduler_TP0..N-1``,
each holding its ``/dev/nvidiaN``, and ``sglang::detokenizer``, holding none.

The workers are forked, not exec'd (one interpreter per server, its pages shared
copy-on-write): each runs ``programs.run`` with a ``holder`` spec, sets its title
(NUL-padded, as setproctitle leaves it) and comm, and gets the environment block an exec
would have given it (``proctitle.set_environ``: the workers' holds
``FLEETCLEAN_SIM_GPU_MIB``, the detokenizer's does not), so that ``ps``, ``/proc`` and the
fake nvidia-smi see what they saw of an interpreter per worker.

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
import gc
import importlib
import os
import signal
import sys
import traceback
from types import ModuleType
from typing import Any


def load_programs(path: str) -> tuple[ModuleType, ModuleType]:
    """The simulator's ``programs`` and ``proctitle``, siblings in ``path``'s directory
    (appended to sys.path: nothing of ours is shadowed)."""
    sys.path.append(os.path.dirname(path))
    return importlib.import_module("programs"), importlib.import_module("proctitle")


def start_worker(modules: tuple[ModuleType, ModuleType], spec: dict[str, Any],
                 env: dict[str, str]) -> int:
    """Fork a worker that becomes ``spec`` (``programs.run``) with environment ``env``."""
    programs, proctitle = modules
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            proctitle.set_environ(env)
            programs.run(spec)
        except BaseException:
            traceback.print_exc()
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
    modules = load_programs(os.environ["FLEETCLEAN_SIM_PROGRAMS"])
    # What the forked workers share stays shared (the collector would touch it).
    gc.collect()
    gc.freeze()
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
        workers.append(start_worker(modules, spec, dict(os.environ)))
    detokenizer = {
        "role": "holder",
        "title": "sglang::detokenizer",
        "comm": "sglang::detoken",
        "setproctitle": True,
    }
    env = dict(os.environ)
    env.pop("FLEETCLEAN_SIM_GPU_MIB", None)
    workers.append(start_worker(modules, detokenizer, env))

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
