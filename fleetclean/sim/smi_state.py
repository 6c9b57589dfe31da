"""What the fake nvidia-smi reads and writes inside a node: GPUs, holders, faults, leaks.

Standard library only; imported by ``nvidia_smi`` (as a sibling module inside nodes, through
the package in tests). Files in ``NODE_DIR`` (the node's state dir, ``/run/fleetclean``):

- ``gpus.json``: {"gpus": [{"index", "uuid", "bus_id", "minor"}]} (``minor``: the N of the
  GPU's ``/dev/nvidiaN``); ``gpu_count`` (``7``) hides the
  last GPUs, as a board whose GPU the driver did not enumerate.
- ``fault``: one word for the whole tool, with its argument after a colon: ``none``,
  ``na``, ``nvml``, ``driver``, ``inforom:GPU``, ``nodevices[:STATUS]``, ``nosupported``.
- ``lost``, ``power``, ``irq``, ``unknown``: indexes of GPUs that fell off the bus, lack
  external power, have an interrupt issue, whose handle fails with Unknown Error (see
  ``GPU_ERRORS``); ``pages.json``: {"retired": [i, ...], "remapped": [i, ...]}, GPUs with
  retired pages / remapped rows pending; ``badvalue.json``: {"3": "reset"}: GPUs whose
  memory reads as an error word (see ``BAD_VALUES``).
- ``leaks.json``: {"5": 512}: MiB allocated on a GPU with no process (freed by a reset).
- ``persistence.json``: {"0": false}: persistence mode per GPU (on unless listed off);
  ``reset_policy``: ``strict`` (nvidia-persistenced's handles block a reset, the default)
  or ``lenient``; ``reset_delay``: seconds a reset takes (default 0).
- ``calls``: where it exists, every invocation's arguments are appended to it, a line each
  (a test counts how often a script asked; the real tool keeps no such log, and none is
  kept unless a test creates the file).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from types import ModuleType

NODE_DIR = "/run/fleetclean"
DEFAULT_MIB = 1024
PERSISTENCED_COMM = "nvidia-persiste"


class DriverDown(Exception):
    """The node's driver stand-in does not answer: as a driver that is not loaded."""


def _driver() -> ModuleType:
    # Imported by the accounts that need it only: root's queries (every monitoring loop's)
    # do without the socket module's import time.
    if __package__:
        from fleetclean.sim import smi_driver
    else:  # inside a node: a script, its siblings found through sys.path[0]
        import smi_driver  # type: ignore[import-not-found,no-redef]
    return smi_driver


class Usage(Exception):
    """A failed invocation: message for stdout, exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def path(name: str) -> str:
    return os.path.join(NODE_DIR, name)


def log_call(argv: list[str]) -> None:
    """``argv`` appended to the ``calls`` file, where a test created one."""
    try:
        with open(path("calls"), "r+") as f:
            f.seek(0, os.SEEK_END)
            f.write(" ".join(argv) + "\n")
    except OSError:  # no such file (no test asked), or not this account's to write
        pass


def read_text(name: str, default: str = "") -> str:
    try:
        with open(path(name)) as f:
            return f.read().strip()
    except OSError:
        return default


def read_json(name: str) -> dict[str, object]:
    try:
        data = json.loads(read_text(name, "{}"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def write_json(name: str, data: object) -> None:
    tmp = path(name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path(name))


def read_fault() -> str:
    return read_text("fault", "none") or "none"


def indexes(text: str) -> set[int]:
    """``"1 5"`` or ``"1,5"`` -> {1, 5}."""
    return {int(w) for w in text.replace(",", " ").split() if w.isdigit()}


# file -> (nvidia-smi's exit status, NVML's words after "Unable to determine the device
# handle for GPU...: "), as nvidia-smi documents its return codes.
GPU_ERRORS = {
    "lost": (15, "GPU is lost.  Reboot the system to recover this GPU"),
    "power": (8, "Insufficient External Power"),
    "irq": (10, "Interrupt request issue"),
    # NVML_ERROR_UNKNOWN: as when a GPU failed on the bus and the driver cannot open it
    # (users' reports: NVIDIA/open-gpu-kernel-modules#387, NVIDIA/nvidia-docker#1553, whose
    # older driver printed "GPU 0000:09:00.0", a space before the bus id; drivers from 525
    # on print none, as here). Its exit status was not captured: 255 is nvidia-smi's
    # documented "other error" status.
    "unknown": (255, "Unknown Error"),
}

# badvalue.json's words -> what nvidia-smi prints in place of a value NVML could not read
# (the CSV query's form; ``-q`` prints it without the brackets, as it prints N/A; the bare
# table keeps its numbers: not simulated there). Not captured from a real GPU.
BAD_VALUES = {
    "reset": "[GPU requires reset]",
    "unknown": "[Unknown Error]",
    "lost": "[GPU is lost]",
}


def lost() -> set[int]:
    return indexes(read_text("lost"))


def gpu_errors() -> dict[int, tuple[int, str]]:
    """GPUs nvidia-smi cannot open: index -> (exit status, words)."""
    found: dict[int, tuple[int, str]] = {}
    for name, error in GPU_ERRORS.items():
        for index in indexes(read_text(name)):
            found.setdefault(index, error)
    return found


def bad_values() -> dict[int, str]:
    """GPUs whose memory NVML cannot read: index -> the bracketed words printed instead."""
    found: dict[int, str] = {}
    for key, word in read_json("badvalue.json").items():
        if str(key).isdigit() and word in BAD_VALUES:
            found[int(key)] = BAD_VALUES[str(word)]
    return found


def pending(kind: str) -> set[int]:
    """GPUs with ``retired`` pages or ``remapped`` rows pending."""
    value = read_json("pages.json").get(kind, [])
    return {int(str(v)) for v in value} if isinstance(value, list) else set()


def leaks() -> dict[int, int]:
    return {int(k): int(str(v)) for k, v in read_json("leaks.json").items()}


def persistence() -> dict[int, bool]:
    return {int(k): bool(v) for k, v in read_json("persistence.json").items()}


def all_gpus() -> list[dict[str, object]]:
    with open(path("gpus.json")) as f:
        gpus: list[dict[str, object]] = json.load(f)["gpus"]
    count = read_text("gpu_count")
    return gpus[: int(count)] if count.isdigit() else gpus


def load_gpus(ids: str | None) -> list[dict[str, object]]:
    """The GPUs an ``-i`` selection names (all without one); Usage(6) if one is unknown."""
    gpus = all_gpus()
    if not gpus:
        raise Usage("No devices were found", 6)
    if ids is None:
        return gpus
    wanted = ids.split(",")
    chosen = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
    if len(chosen) != len(wanted):
        raise Usage("No devices were found", 6)
    return chosen


def live_dir(pid: str) -> str:
    """Where PID's files and environment are read: ``/proc/PID``, or where its main thread
    has exited while another lives on (``ps`` reads ``Zl``: the leader a zombie, its
    /proc/PID/fd empty and its environ unreadable) one of the living threads'
    ``/proc/PID/task/TID``. The driver's context belongs to the process, not to a thread:
    it holds the GPU until the last thread's exit closes the device files, and the real
    nvidia-smi goes on listing the PID, so this one must find its devices too."""
    base = f"/proc/{pid}"
    try:
        tids = [t for t in os.listdir(f"{base}/task") if t != pid]
    except OSError:
        return base
    return f"{base}/task/{tids[0]}" if tids else base


def process_mib(base: str) -> tuple[int, set[int] | None]:
    """What the process of ``base`` (``/proc/PID``, or its live_dir) uses on each GPU
    whose file it holds: ``FLEETCLEAN_SIM_GPU_MIB`` of its initial environment, and the
    GPUs (indexes) where it has a context, ``FLEETCLEAN_SIM_GPU_CONTEXTS`` (None: every
    GPU whose file it holds). A CUDA
    process that sees every GPU (no CUDA_VISIBLE_DEVICES, no device cgroup) opens every
    GPU's file and uses memory on its own GPUs only."""
    mib, contexts = DEFAULT_MIB, None
    try:
        with open(f"{base}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"FLEETCLEAN_SIM_GPU_MIB="):
                    mib = int(item[23:])
                elif item.startswith(b"FLEETCLEAN_SIM_GPU_CONTEXTS="):
                    contexts = {int(g) for g in item[28:].split(b",") if g}
    except (OSError, ValueError):
        pass
    return mib, contexts


def process_name(pid: str) -> str:
    """Like nvidia-smi: the process's argv[0] exactly as given, i.e. the first NUL-separated
    field of its command line (``/opt/torch/.venv/bin/python3``, directory kept, as the
    real tool printed it: tests/data/nvidia-smi/h200/apps_two_held.txt). A process that
    rewrote its title without NULs (``sglang::scheduler_TP0``, ``sshd: root@pts/0``) has
    the whole title as that field, spaces included.

    An empty command line (a zombie, a kernel thread) and a PID gone from /proc read
    ``[Not Found]``, as the fake always has: a bracketed word that no argv[0] is likely to
    be, so a reader takes it for no name. What real nvidia-smi prints then is not captured
    (it might print the comm, or nothing; where the PID is not in its PID namespace, users
    report the table leaving the process out: NVIDIA/nvidia-docker#1460)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            first = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return "[Not Found]"
    return first or "[Not Found]"


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def index_by_minor() -> dict[int, int]:
    """Device minor -> GPU index (``/dev/nvidiaN`` is the GPU whose minor is N)."""
    with open(path("gpus.json")) as f:
        gpus = json.load(f)["gpus"]
    return {int(g.get("minor", g["index"])): int(g["index"]) for g in gpus}


def device_holders() -> list[tuple[int, int, int]]:
    """(gpu index, pid, MiB) for every live process holding a GPU's /dev/nvidiaN (N its
    minor number), sorted; MiB is 0 for a handle without a CUDA context
    (nvidia-persistenced, or a CUDA process's file of a GPU it does not use:
    process_mib). Whoever asks: an account other than root cannot read other users'
    /proc/PID/fd, so it asks the node's driver stand-in (``smi_driver``), as the real
    nvidia-smi asks the kernel driver."""
    if os.geteuid() != 0:
        try:
            holders: list[tuple[int, int, int]] = _driver().ask()
        except (OSError, ValueError) as exc:
            raise DriverDown(str(exc)) from exc
        return holders
    return scan_device_holders()


def open_files() -> Iterator[tuple[int, str, list[str]]]:
    """Each process of the node (root reads them all): its PID, where its files are read
    (``live_dir``) and what its descriptors that could be read point to."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        try:
            fds = os.listdir(f"{base}/fd")
            if not fds:  # a zombie, or one whose main thread exited (live_dir)
                base = live_dir(pid)
                fds = os.listdir(f"{base}/fd")
        except OSError:
            continue
        targets = []
        for fd in fds:
            with contextlib.suppress(OSError):
                targets.append(os.readlink(f"{base}/fd/{fd}"))
        yield int(pid), base, targets


def scan_device_holders() -> list[tuple[int, int, int]]:
    """``device_holders`` read from /proc, which needs root."""
    by_minor = index_by_minor()
    found: list[tuple[int, int, int]] = []
    for pid, base, targets in open_files():
        gpus = set()
        for target in targets:
            minor = target[11:]
            if target.startswith("/dev/nvidia") and minor.isdigit() and int(minor) in by_minor:
                gpus.add(by_minor[int(minor)])
        if gpus:
            mib, contexts = process_mib(base)
            found.extend((gpu, pid, mib if contexts is None or gpu in contexts else 0)
                         for gpu in gpus)
    return sorted(found)


def holders() -> list[tuple[int, int, int]]:
    """The compute apps: device holders with a context (MiB above 0)."""
    return [h for h in device_holders() if h[2] > 0]
