"""The processes a simulated workload is made of: GPU holders, agents, writers, supervisors.

Runs inside a node as ``python3 programs.py SPEC_JSON`` (standard library only, never
imported through the package). SPEC_JSON is padded with spaces so that the argv area is
long enough to be overwritten by the process title, the way setproctitle(3) does it: after
start-up ``/proc/PID/cmdline`` reads exactly ``spec["title"]`` (``sglang::scheduler_TP3``,
``python3 /opt/monitor/agent.py`` ...) and ``/proc/PID/comm`` reads ``spec["comm"]``.

Spec keys (all optional but ``role``):

- ``role``: ``holder`` (open devices, sleep), ``writer`` (keep ``path`` open for writing),
  ``supervisor`` (re-run ``child`` spec within ~100 ms whenever it dies), ``tree`` (fork
  ``children`` specs, see ``tree``), ``persistenced`` (see ``persistenced``).
- ``setproctitle``: the title is NUL-padded as setproctitle leaves it; ``argv``: a list
  written NUL-separated instead of ``title`` (a binary's command line).
- ``gpus``: GPU indexes whose ``/dev/nvidiaN`` to hold (N the GPU's minor number, from
  the node's gpus.json); ``ctl``: also hold ``/dev/nvidiactl`` and ``/dev/nvidia-uvm``
  (``ctl_only`` holds nvidiactl alone); ``nvml``: /dev/nvidiactl and every GPU, no
  /dev/nvidia-uvm (a monitoring agent).
- ``on_term``: ``exit`` after ``delay`` seconds (default 0.1, a CUDA teardown), or
  ``ignore``.
- ``driver_wait: hang``: once ready, wait in a driver request that is never answered
  (``stuckfs``): state D after SIGKILL, which it survives while the node's driver is stuck.
  ``hang-thread``: the request waits in a second thread, as a CUDA process's driver calls
  often do: killed, the main thread exits and is a zombie (``ps`` reads ``Zl``: no command
  line, no /proc/PID/fd) while the waiting thread stays in state D, the GPU still held.
- ``main_exit``: once ready, the main thread calls ``pthread_exit`` while a second thread
  works on (with ``driver_wait: hang-thread``, the thread waiting in the driver alone): the
  leader is a zombie (``ps`` reads ``Zl``: no command line, no /proc/PID/fd) and the
  process is alive, its files open in that thread, the GPU held. No Python handler can
  run without the main thread: SIGTERM is the kernel's default (ends the process, as a C
  program's) unless ``on_term`` is ``ignore``.
- ``exit_ms``: hold a ``stuckfs`` file opened after the devices, whose close at exit takes
  that long: killed, the process sits in its exit (no command line, devices released).

Readiness: when ``FLEETCLEAN_SIM_READY_FD`` names an inherited pipe, the process writes its
PID there once its devices are open and closes it; the launcher waits for that.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

if __package__:
    from fleetclean.sim import uvm_count
    from fleetclean.sim.proctitle import set_plain_title, set_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import uvm_count  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title, set_title  # type: ignore[import-not-found,no-redef]

READY_FD = "FLEETCLEAN_SIM_READY_FD"
READY_PATH = "FLEETCLEAN_SIM_READY_PATH"
PERSISTENCE = "/run/fleetclean/persistence.json"
GPUS = "/run/fleetclean/gpus.json"
PERSISTENCED_PID = "/run/nvidia-persistenced/nvidia-persistenced.pid"
# The real daemon's command line, as a node's init (node_init) and `sim spawn NODE
# persistenced` (launcher) both give it.
PERSISTENCED_ARGV = ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced", "--verbose"]
STUCKFS = "/run/fleetclean-stuck"  # stuckfs.MOUNTPOINT


def node_pid() -> int:
    """This process's PID as the node sees it: /proc is the node's, so /proc/self names it
    even inside a container's own PID namespace (where getpid() may be 1)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def open_ready_path() -> None:
    """A supervisor started us (a unit, a container, a tmux pane): readiness goes to the
    FIFO the launcher named, opened once here so that every process of the workload
    inherits it. Gone (a restart, long after the launcher): nobody is waiting."""
    path = os.environ.pop(READY_PATH, None)
    if path is None or READY_FD in os.environ:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.set_blocking(fd, True)
    os.set_inheritable(fd, True)
    os.environ[READY_FD] = str(fd)


def report_ready() -> None:
    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return
    try:
        os.write(int(fd), f"{node_pid()}\n".encode())
        os.close(int(fd))
    except OSError:
        pass


def apply_title(spec: dict[str, Any]) -> None:
    """``setproctitle``: NUL-padded title (sglang::, VLLM::, ray::); ``argv``: a rewritten
    command line (binaries such as tritonserver); else the plain title."""
    comm = spec.get("comm", "python3")
    if spec.get("argv"):
        set_title("", comm, argv=[str(a) for a in spec["argv"]])
    elif spec.get("setproctitle"):
        set_title(spec["title"], comm)
    else:
        set_plain_title(spec.get("title", "python3"), comm)


def device_path(index: int) -> str:
    """The device file of GPU ``index``: ``/dev/nvidiaN``, N its minor number."""
    try:
        with open(GPUS) as f:
            gpus = json.load(f)["gpus"]
    except (OSError, ValueError, KeyError):
        gpus = []
    minor = next((g.get("minor", index) for g in gpus if g["index"] == index), index)
    return f"/dev/nvidia{minor}"


def open_devices(spec: dict[str, Any]) -> list[int]:
    """A CUDA process's files: its GPUs (every GPU with ``sees_all``), /dev/nvidiactl and
    /dev/nvidia-uvm (counted in the node's /sys/module/nvidia_uvm/refcnt); an NVML user's
    (``nvml``): /dev/nvidiactl and every GPU, no /dev/nvidia-uvm."""
    paths = [device_path(int(i)) for i in spec.get("gpus", [])]
    if spec.get("sees_all"):
        # CUDA without CUDA_VISIBLE_DEVICES or a device cgroup opens every GPU's file; its
        # contexts are on its own GPUs only (launcher.plan: FLEETCLEAN_SIM_GPU_CONTEXTS).
        paths += [path for path in map(device_path, all_gpus()) if path not in paths]
    if spec.get("ctl") or spec.get("gpus"):
        paths += ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    if spec.get("nvml"):
        paths = ["/dev/nvidiactl", *(device_path(i) for i in all_gpus())]
    if spec.get("ctl_only"):
        paths = ["/dev/nvidiactl"]
    held = [os.open(p, os.O_RDWR) for p in paths]
    if uvm_count.DEVICE in paths:
        uvm_count.opened()  # the node's nvidia_uvm refcnt counts it before we are ready
    return held


def all_gpus() -> list[int]:
    """The node's GPU indexes (nvidia-smi's), from its gpus.json."""
    try:
        with open(GPUS) as f:
            return sorted(int(g["index"]) for g in json.load(f)["gpus"])
    except (OSError, ValueError, KeyError):
        return []


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
    return run(spec)


def run(spec: dict[str, Any]) -> int:
    """Be the process ``spec`` describes (a forked child can call this instead of exec'ing
    ``programs.py``: see the fake SGLang's workers); returns only for a supervisor."""
    open_ready_path()
    apply_title(spec)
    role = spec["role"]
    if role == "supervisor":
        # The supervisor reports itself; its first child reports through the same pipe.
        fd = os.environ.get(READY_FD)
        if fd is not None:
            os.write(int(fd), f"{node_pid()}\n".encode())
        supervise(spec)
        return 0
    if role == "persistenced":
        persistenced(bool(spec.get("ctl_only")))
    if role == "tree":
        tree(spec)
    install_term(spec)
    held = open_devices(spec)
    if spec.get("exit_ms") is not None:
        # Opened after the devices: the exit closes those first, then waits on this one.
        held.append(os.open(os.path.join(STUCKFS, f"exit-{int(spec['exit_ms'])}"), os.O_RDONLY))
    if role == "writer":
        path = spec["path"]
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        out = open(path, "ab")  # noqa: SIM115 - held open for the life of the process
        out.write(b"hidden states\n")
        out.flush()
        held.append(out.fileno())
    report_ready()
    if spec.get("driver_wait") == "hang":
        driver_hang()
    elif spec.get("driver_wait") == "hang-thread":
        threading.Thread(target=driver_hang, daemon=True).start()
    if spec.get("main_exit"):
        main_thread_exit(spec)
    while True:
        signal.pause()


def main_thread_exit(spec: dict[str, Any]) -> None:
    """End the main thread alone (``pthread_exit``), a second thread working on: the
    process lives, its leader a zombie that keeps the PID, its files (the devices) held by
    that thread. Python runs signal handlers in its main thread only: with none, SIGTERM
    is the kernel's default (the process ends), or ignored."""
    term = signal.SIG_IGN if spec.get("on_term") == "ignore" else signal.SIG_DFL
    signal.signal(signal.SIGTERM, term)
    if spec.get("driver_wait") != "hang-thread":
        threading.Thread(target=work_on, name="worker").start()
    # ctypes lets go of the GIL around the call: the worker thread runs on without it.
    ctypes.CDLL(None).pthread_exit(None)


def work_on() -> None:
    """A thread that holds nothing of its own and never ends (the process's files are
    the whole process's): asleep, as a worker between requests."""
    while True:
        time.sleep(3600)


def driver_hang() -> None:
    """Wait in a driver request the node's stuck driver never answers (stuckfs)."""
    with contextlib.suppress(OSError):  # EIO once the node's driver is unstuck
        os.stat(os.path.join(STUCKFS, f"hang-{threading.get_native_id()}"))


def persistence_enabled() -> list[int]:
    """GPUs whose persistence mode is on (all of them until ``nvidia-smi -pm 0``)."""
    try:
        with open(PERSISTENCE) as f:
            modes: dict[str, bool] = json.load(f)
    except (OSError, ValueError):
        modes = {}
    return [g for g in all_gpus() if modes.get(str(g), True)]


def persistenced(ctl_only: bool = False) -> None:
    """nvidia-persistenced: /dev/nvidiactl and every /dev/nvidiaN whose persistence mode
    is on, held open with no CUDA context (0 MiB, no compute app). SIGHUP (sent by
    ``nvidia-smi -pm``) re-reads the modes, closing and reopening handles to match."""
    os.makedirs(os.path.dirname(PERSISTENCED_PID), exist_ok=True)
    with open(PERSISTENCED_PID, "w") as f:
        f.write(f"{os.getpid()}\n")
    _ctl = os.open("/dev/nvidiactl", os.O_RDWR)
    held: dict[int, int] = {}

    def sync(*_: object) -> None:
        want = set() if ctl_only else set(persistence_enabled())
        for gpu in [g for g in held if g not in want]:
            os.close(held.pop(gpu))
        for gpu in sorted(want - set(held)):
            held[gpu] = os.open(device_path(gpu), os.O_RDWR)

    signal.signal(signal.SIGHUP, sync)
    sync()
    report_ready()
    while True:
        signal.pause()


def tree(spec: dict[str, Any]) -> None:
    """One process of a process tree (an inference server): fork its ``children`` (no
    new interpreter: busy nodes stay cheap), hold its ``gpus``, and on SIGTERM pass the
    signal on to its children and exit. ``reap: false`` leaves dead children as zombies
    for as long as this process lives, as a parent that never calls wait() does."""
    children = []
    for child in spec.get("children", []):
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                apply_title(child)
                tree(child)
            finally:
                os._exit(0)
        children.append(pid)
    if spec.get("reap", True):
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _held = open_devices(spec)
    delay = float(spec.get("delay", 0.1))

    def on_term(signum: int, frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(0 if children else delay)
        os._exit(0)

    if spec.get("on_term") == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    report_ready()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
