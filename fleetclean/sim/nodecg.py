"""A node's own cgroup tree, from inside the node: join it at start, then place processes.

Runs inside a node (standard library only, imported as a sibling module by ``node_init``,
``launcher`` and the supervisors). The host made one root per hierarchy for the node
(``cgroups.py``) and wrote ``cgroups.tsv`` into the node's dir; the node's init joins those
roots, unshares its cgroup namespace (so that the roots read ``/`` in ``/proc/PID/cgroup``)
and mounts the hierarchies at ``/sys/fs/cgroup`` as a real node has them. Every other
node-side program uses :class:`Tree` to place the processes it starts, the way systemd,
runc or slurmstepd do on a real node, and only those.

Roles decide which hierarchy gets which path: ``v2`` (cgroup2) and ``systemd`` (v1
``name=systemd``) follow systemd's tree; the ``managed`` v1 controllers, memory and pids, do
too, as systemd's default accounting (DefaultMemoryAccounting=, DefaultTasksAccounting=)
puts units there; the ``other`` v1 controllers (cpu, cpuset, freezer...) stay at ``/``.
Containers, pods and jobs are placed at one path in every hierarchy (runc and Slurm join
them all).

>>> role("name=systemd"), role("memory"), role("cpu,cpuacct"), role("")
('systemd', 'managed', 'other', 'v2')
>>> unit_placement("system.slice/ssh.service")["other"]
'/'
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

CONFIG_NAME = "cgroups.tsv"
CONFIG = "/run/fleetclean/" + CONFIG_NAME
CLONE_NEWCGROUP = 0x02000000
MANAGED = {"memory", "pids"}
ROLES = ("v2", "systemd", "managed", "other")
Placement = dict[str, str]


def role(key: str) -> str:
    """The role of the hierarchy named ``key`` in /proc/PID/cgroup."""
    if key == "":
        return "v2"
    if key.startswith("name="):
        return "systemd" if key == "name=systemd" else "other"
    return "managed" if set(key.split(",")) & MANAGED else "other"


def unit_placement(rel: str) -> Placement:
    """Where systemd puts a unit or scope's processes (``system.slice/x.service``)."""
    return {"v2": rel, "systemd": rel, "managed": rel, "other": "/"}


def everywhere(rel: str) -> Placement:
    """One path in every hierarchy: a container, a pod's container, a job step."""
    return dict.fromkeys(ROLES, rel)


# ----------------------------------------------------------------- the node's config


def format_config(mode: str, hierarchies: list[dict[str, str]]) -> str:
    """``cgroups.tsv``: the mode, then key, type, options, host path of the node's root
    and mount point inside the node, one hierarchy a line. Tab-separated text rather than
    JSON: the node's init reads it before anything else, and importing json there would
    cost every node start a few milliseconds.

    >>> text = format_config("v2", [{"key": "", "fstype": "cgroup2", "options": "rw",
    ...                               "host": "/cg/n1", "mount": "/sys/fs/cgroup"}])
    >>> read_config(text)["hierarchies"][0]["mount"]
    '/sys/fs/cgroup'
    """
    lines = [f"mode\t{mode}"]
    lines += ["\t".join(h[k] for k in FIELDS) for h in hierarchies]
    return "\n".join(lines) + "\n"


FIELDS = ("key", "fstype", "options", "host", "mount")


def read_config(text: str) -> dict[str, Any] | None:
    """The config a ``cgroups.tsv`` holds; None for a fleet without cgroups."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("mode\t") or lines[0] == "mode\tnone":
        return None
    rows = [dict(zip(FIELDS, line.split("\t"), strict=True)) for line in lines[1:] if line]
    return {"mode": lines[0].split("\t")[1], "hierarchies": rows}


# ----------------------------------------------------------------- the init, at start


def join_and_unshare(node_dir: str) -> dict[str, Any] | None:
    """In the node's init, before anything else: join the roots the host made (host paths
    are still visible), then unshare the cgroup namespace. None when the fleet has no
    cgroups; OSError when it cannot be done (the node then fails to start, loudly)."""
    try:
        with open(os.path.join(node_dir, CONFIG_NAME)) as f:
            config = read_config(f.read())
    except FileNotFoundError:
        return None
    if config is None:
        return None
    for h in config["hierarchies"]:
        with open(os.path.join(h["host"], "cgroup.procs"), "w") as f:
            f.write("0")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWCGROUP) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWCGROUP): {os.strerror(err)}")
    return config


def mount_hierarchies(config: dict[str, Any], mount: Callable[..., None]) -> None:
    """Mount the node's view of each hierarchy (rooted at its own root, being mounted from
    inside its cgroup namespace). ``mount(source, target, fstype, flags, data)`` is the
    init's mount(2). A v1 node gets a tmpfs at /sys/fs/cgroup with one directory each."""
    nosuid_nodev_noexec = 0x2 | 0x4 | 0x8
    if config["mode"] == "v1":
        mount("tmpfs", "/sys/fs/cgroup", "tmpfs", nosuid_nodev_noexec, "mode=0755")
    for h in config["hierarchies"]:
        target = h["mount"]
        if h["fstype"] == "cgroup2":
            data = ",".join(o for o in h["options"].split(",") if o not in ("rw", "ro"))
        else:
            # Only what names the hierarchy: a release_agent may not be set from here.
            data = h["key"] if not h["key"].startswith("name=") else "none," + h["key"]
        os.makedirs(target, exist_ok=True)
        mount(h["fstype"], target, h["fstype"], nosuid_nodev_noexec, data)
        if config["mode"] == "v1" and "," in h["key"]:
            # As a real node: /sys/fs/cgroup/cpu -> cpu,cpuacct (Slurm looks for these).
            for name in h["key"].split(","):
                link = os.path.join("/sys/fs/cgroup", name)
                if not os.path.lexists(link):
                    os.symlink(os.path.basename(target), link)


# ----------------------------------------------------------------- inside a running node


class Tree:
    """The node's hierarchies as mounted inside it; empty (every call a no-op) when the
    fleet runs without cgroups."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.mode = "none" if config is None else str(config.get("mode", "none"))
        self.mounts: list[tuple[str, str]] = []
        if config is not None and self.mode != "none":
            self.mounts = [(role(h["key"]), h["mount"]) for h in config["hierarchies"]]

    @classmethod
    def load(cls) -> Tree:
        try:
            with open(CONFIG) as f:
                return cls(read_config(f.read()))
        except (OSError, ValueError):
            return cls(None)

    def procs_files(self, where: Placement) -> list[str]:
        """The ``cgroup.procs`` files of placement ``where``, its cgroups made if missing."""
        files = []
        for hier_role, mount in self.mounts:
            rel = where.get(hier_role, "/").strip("/")
            path = os.path.join(mount, rel) if rel else mount
            os.makedirs(path, exist_ok=True)
            files.append(os.path.join(path, "cgroup.procs"))
        return files

    def place(self, pid: int, where: Placement) -> None:
        """Move ``pid`` (0: the caller) into ``where``, making the cgroups it needs."""
        join(self.procs_files(where), pid)

    def delegate(self, rel: str, uid: int, gid: int) -> bool:
        """Hand the cgroup2 subtree ``rel`` to ``uid``, as systemd's ``Delegate=yes`` hands
        ``user@UID.service`` to its user (cgroup-v2.rst, "Delegation Containment"): the
        directory and its cgroup.procs, cgroup.threads and cgroup.subtree_control become
        the user's, so that the user's own processes (a rootless container runtime) may
        make cgroups below it and move their children there. Only on cgroup v2, where an
        unprivileged delegation is safe; False where there is none to hand over."""
        for hier_role, mount in self.mounts:
            if hier_role != "v2" or self.mode != "v2":
                continue
            top = os.path.join(mount, rel.strip("/"))
            os.makedirs(top, exist_ok=True)
            os.chown(top, uid, gid)
            for name in ("cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
                with contextlib.suppress(FileNotFoundError):
                    os.chown(os.path.join(top, name), uid, gid)
            return True
        return False

    def _primary(self, rel: str) -> str | None:
        for wanted in ("v2", "systemd", "managed", "other"):
            for hier_role, mount in self.mounts:
                if hier_role == wanted:
                    return os.path.join(mount, rel.strip("/"))
        return None

    def procs(self, rel: str) -> list[int]:
        """PIDs in the cgroup ``rel`` and below ([] without cgroups)."""
        top = self._primary(rel)
        found: list[int] = []
        if top is None or not os.path.isdir(top):
            return found
        for path, _, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        found += [int(p) for p in f.read().split()]
                except OSError:
                    continue
        return found

    def remove(self, rel: str) -> None:
        """Remove the cgroup ``rel`` (and what is below it) wherever it is empty, as systemd
        and runc do once a unit or container is gone."""
        for _, mount in self.mounts:
            top = os.path.join(mount, rel.strip("/"))
            for path, dirs, _ in os.walk(top, topdown=False):
                for name in dirs:
                    _rmdir(os.path.join(path, name))
            _rmdir(top)


def join(procs_files: list[str], pid: int = 0) -> None:
    """Move ``pid`` (0: the caller) into the cgroups whose ``cgroup.procs`` are given."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(pid))


def _rmdir(path: str) -> None:
    with contextlib.suppress(OSError):  # not empty: a process is still there
        os.rmdir(path)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_empty(alive: Callable[[], list[int]], timeout: float) -> bool:
    """Poll until ``alive()`` is empty; False if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` (how a fleet without cgroups finds a unit's)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] != b"Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out

