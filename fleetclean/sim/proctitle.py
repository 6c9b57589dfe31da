"""Set a process title the way setproctitle(3) does on Linux, for processes inside nodes.

Imported as a sibling module (``from proctitle import set_title``) by the node-side
scripts, which run by path with the standard library only.
"""

from __future__ import annotations

import ctypes
import os


def _argv_area() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # Fields 48 and 49 of stat(5) are arg_start and arg_end; fields[0] is field 3.
    return int(fields[45]), int(fields[46])


def set_title(title: str, comm: str, *, argv: list[str] | None = None) -> None:
    """Make /proc/self/cmdline read ``title`` by overwriting the argv area in place.

    As setproctitle does when it cannot move the area (it has no CAP_SYS_RESOURCE for
    prctl(PR_SET_MM)): the title, then NUL bytes to the end of the old argv area, so the
    kernel returns the title followed by every NUL of the area (``sglang::scheduler_TP0``
    then hundreds of ``\\0``). ``argv`` instead writes those words NUL-separated, the
    padding still after them: a program that rewrote its whole command line. A title
    longer than the area is cut.
    """
    start, end = _argv_area()
    text = "\0".join(argv) if argv is not None else title
    data = text.encode()[: end - start - 1]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, data, len(data))
    with open("/proc/self/comm", "w") as f:
        f.write(comm[:15])


def set_plain_title(title: str, comm: str) -> None:
    """The older convention for programs that are not setproctitle users: the title, a
    NUL, and a non-NUL last byte, so the kernel stops at the first NUL and cmdline reads
    exactly ``title`` with no padding (``python3 /opt/monitor/agent.py``)."""
    start, end = _argv_area()
    data = title.encode()[: end - start - 2] + b"\0"
    ctypes.memmove(start, data, len(data))
    ctypes.memset(end - 1, ord(" "), 1)
    with open("/proc/self/comm", "w") as f:
        f.write(comm[:15])


def set_environ(env: dict[str, str]) -> None:
    """Make /proc/self/environ read ``env``: what a forked process that never execs shows
    to whoever reads it (the fake nvidia-smi reads ``FLEETCLEAN_SIM_GPU_MIB`` there).

    The environment block is rewritten in place, NUL-padded to its old end (moving it,
    prctl(PR_SET_MM), needs CAP_SYS_RESOURCE, which a container's root may lack);
    ValueError when ``env`` does not fit (the node's init is started with room: see
    ``zygote.ENV_ROOM``). ``os.environ`` is set to match; libc's own ``environ`` pointers
    are left pointing into the old block, so a caller that execs must pass an explicit
    environment (``os.execve``)."""
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    start, end = _env_area()
    if len(data) > end - start:
        raise ValueError(f"environment of {len(data)} bytes does not fit in {end - start}")
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, data, len(data))
    os.environ.clear()
    os.environ.update(env)


def _env_area() -> tuple[int, int]:
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # Fields 50 and 51 of stat(5): env_start and env_end.
    return int(fields[47]), int(fields[48])
