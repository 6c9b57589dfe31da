"""Set a process title the way setproctitle(3) does, for processes inside nodes.

Imported as a sibling module (``from proctitle import set_title``) by the node-side
scripts, which run by path with the standard library only.
"""

from __future__ import annotations

import ctypes


def set_title(title: str, comm: str) -> None:
    """Make /proc/self/cmdline read ``title`` by overwriting the argv area in place.

    The kernel returns the argv area up to its first NUL when the area's last byte is
    not NUL (the setproctitle convention), so the title is written NUL-terminated and the
    last byte is set to a space. prctl(PR_SET_MM) would be cleaner but needs
    CAP_SYS_RESOURCE, which containers often lack. A title longer than the area is cut.
    """
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # Fields 48 and 49 of stat(5) are arg_start and arg_end; fields[0] is field 3.
    start, end = int(fields[45]), int(fields[46])
    data = title.encode()[: end - start - 2] + b"\0"
    ctypes.memmove(start, data, len(data))
    ctypes.memset(end - 1, ord(" "), 1)
    with open("/proc/self/comm", "w") as f:
        f.write(comm[:15])
