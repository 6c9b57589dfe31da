"""Linux's cgroup file system, read: which hierarchies are mounted where (``/proc/PID/
mountinfo``) and which cgroup of each a process is in (``/proc/PID/cgroup``). The simulator
makes its nodes' cgroups with them (``sim.cgroups``); a run reads the pids limit of its own
(``transport.limits``).

>>> h = mounted_hierarchies("30 1 0:26 /docker/ab /sys/fs/cgroup/pids rw - cgroup c rw,pids",
...                         binds=True)[0]
>>> h.key, h.root, in_mount(h, "/docker/ab/x")
('pids', '/docker/ab', '/sys/fs/cgroup/pids/x')
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: ``key`` is its name in /proc/PID/cgroup (``memory``,
    ``cpu,cpuacct``, ``name=systemd``; ``""`` for cgroup2), ``options`` its super options,
    ``root`` the cgroup its mount shows (``/``, or a container's own cgroup bound there)."""

    mount: str
    fstype: str
    key: str
    options: str
    root: str = "/"

    @property
    def v2(self) -> bool:
        return self.fstype == "cgroup2"


def mounted_hierarchies(mountinfo: str, binds: bool = False) -> list[Hierarchy]:
    """The cgroup hierarchies of a mountinfo text, each once (its first mount point);
    with ``binds``, also one that is mounted only as a bind of a cgroup below its root
    (a container's view of its own cgroup, without a cgroup namespace).

    >>> text = ("35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\\n"
    ...         "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\\n"
    ...         "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\\n")
    >>> [(h.key, h.options) for h in mounted_hierarchies(text)]
    [('memory', 'rw,memory'), ('name=systemd', 'rw,name=systemd'), ('', 'rw,nsdelegate')]
    """
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3]
        if fstype not in ("cgroup", "cgroup2") or (fields[3] != "/" and not binds):
            continue  # a bind of a sub-cgroup (a container's view) is not the hierarchy
        key = "" if fstype == "cgroup2" else _v1_key(options)
        found.setdefault(key, Hierarchy(_unescape(fields[4]), fstype, key, options,
                                        _unescape(fields[3])))
    return list(found.values())


def _unescape(field: str) -> str:
    r"""A mountinfo path as it is: the kernel writes space, tab, newline and backslash
    in it as octal escapes.

    >>> _unescape(r"/mnt/my\040cgroups")
    '/mnt/my cgroups'
    """
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _v1_key(options: str) -> str:
    # /proc/PID/cgroup lists a v1 hierarchy's controllers in the kernel's order, which is
    # also the order of its super options; a named hierarchy is "name=X" (after them).
    words = [o for o in options.split(",") if o not in ("rw", "ro")]
    named = [w for w in words if w.startswith("name=")]
    known = [w for w in words if "=" not in w and w not in _V1_FLAGS]
    return ",".join(known + named)


_V1_FLAGS = {"noprefix", "xattr", "clone_children", "cpuset_v2_mode", "none", "favordynmods"}


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """``{key: path}`` from a /proc/PID/cgroup text.

    >>> own_cgroups("4:memory:/process_api/ab\\n0::/\\n")
    {'memory': '/process_api/ab', '': '/'}
    """
    out: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def in_mount(hierarchy: Hierarchy, cgroup: str) -> str | None:
    """Where the cgroup ``cgroup`` (a /proc/PID/cgroup path) of ``hierarchy`` is in the
    file system; None where its mount does not show it (a cgroup outside a bound one).

    >>> in_mount(Hierarchy("/sys/fs/cgroup", "cgroup2", "", "rw"), "/user.slice")
    '/sys/fs/cgroup/user.slice'
    >>> in_mount(Hierarchy("/sys/fs/cgroup", "cgroup2", "", "rw"), "/../other") is None
    True
    """
    # ".." parts: a cgroup outside this process's cgroup namespace, not in its mount
    if ".." in cgroup.split("/"):
        return None
    root = hierarchy.root.rstrip("/")
    if cgroup != root and not cgroup.startswith(root + "/"):
        return None
    return os.path.join(hierarchy.mount, cgroup[len(root):].lstrip("/")).rstrip("/")
