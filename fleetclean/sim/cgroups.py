"""The simulated fleet's cgroups, seen from the host: one tree per fleet, one root per node.

A real node's ``/proc/PID/cgroup`` names who runs a process (``0::/system.slice/vllm.service``,
``4:memory:/docker/3f2a...``); fleetclean reads it to tell a service or a container from a
plain process. So each node gets its own cgroup namespace, rooted at a cgroup made for it
under the fleet's own prefix, beside whatever cgroup ``sim up`` itself runs in::

    /sys/fs/cgroup/unified/<our cgroup>/fleetclean-sim-<fleet id>/node01    (one per hierarchy)

Inside the node that root reads ``/``; the node's init and supervisors (``nodecg.py``) make
``init.scope``, ``system.slice/NAME.service``, ``system.slice/docker-ID.scope``... below it.

Modes (:func:`plan`): ``v2`` puts nodes in the cgroup2 hierarchy alone (a pure cgroup-v2
node); ``v1`` in every v1 hierarchy plus cgroup2 where it is mounted too (a legacy or hybrid
node, where the controller lines name containers and jobs); ``none`` when no hierarchy can
be written, and the fleet runs without supervisors' cgroups. ``auto`` is ``v2`` where the
machine has a writable cgroup2, else ``v1``, else ``none``.

Nothing here moves a process: each node's init joins its own root (``node_init.py``). The
prefixes are recorded in the state dir before they are made, so ``remove`` finds them even
after ``up`` failed half-way; it only ever removes empty cgroups below those prefixes.

>>> mounts = [Hierarchy("/sys/fs/cgroup/memory", "cgroup", "memory", "rw,memory"),
...           Hierarchy("/sys/fs/cgroup/unified", "cgroup2", "", "rw")]
>>> [h.mount for h in select(mounts, "v2")], [h.key for h in select(mounts, "v1")]
(['/sys/fs/cgroup/unified'], ['memory', ''])
>>> node_mount(mounts[0], "v1"), node_mount(mounts[1], "v2")
('/sys/fs/cgroup/memory', '/sys/fs/cgroup')
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetclean.cgroupfs import Hierarchy, mounted_hierarchies, own_cgroups
from fleetclean.errors import SimError
from fleetclean.sim import nodecg

MODES = ("auto", "v2", "v1", "none")
PREFIX = "fleetclean-sim-"
MODE_ENV = "FLEETCLEAN_SIM_CGROUP"
REMOVE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Plan:
    """Where one fleet's cgroups go: its mode and its prefix in each hierarchy used."""

    mode: str
    hierarchies: tuple[Hierarchy, ...]
    prefixes: tuple[str, ...]
    why: str = ""  # for mode none: what made every hierarchy unusable


def select(hierarchies: Sequence[Hierarchy], mode: str) -> list[Hierarchy]:
    """The hierarchies a mode uses: v2 the cgroup2 one, v1 all of them, none none."""
    if mode == "v2":
        return [h for h in hierarchies if h.v2]
    if mode == "v1":
        return [h for h in hierarchies if not h.v2] + [h for h in hierarchies if h.v2]
    return []


def node_mount(hierarchy: Hierarchy, mode: str) -> str:
    """Where the hierarchy is mounted inside a node: a v2 node has cgroup2 at
    /sys/fs/cgroup, as a pure-v2 machine; a v1 node mirrors the host's layout."""
    if mode == "v2":
        return "/sys/fs/cgroup"
    return "/sys/fs/cgroup/" + os.path.basename(hierarchy.mount.rstrip("/"))


def _usable(base: str) -> bool:
    return os.path.isdir(base) and os.access(base, os.W_OK) and os.access(
        os.path.join(base, "cgroup.procs"), os.W_OK
    )


def plan(fleet_id: str, wanted: str = "auto") -> Plan:
    """Decide the mode for a new fleet (``wanted``, else ``$FLEETCLEAN_SIM_CGROUP``, else
    auto) and its prefixes. SimError when a mode asked for by name cannot be had."""
    if wanted == "auto":
        wanted = os.environ.get(MODE_ENV) or "auto"
    if wanted not in MODES:
        raise SimError(f"unknown cgroup mode {wanted!r}", hint=f"one of {', '.join(MODES)}")
    if wanted == "none":
        return Plan("none", (), (), "asked for none")
    try:
        mounts = mounted_hierarchies(Path("/proc/self/mountinfo").read_text())
        own = own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return _no_cgroups(wanted, f"cannot read /proc/self: {exc}")
    bases = {h.key: h.mount + own.get(h.key, "/") for h in mounts}
    usable = [h for h in mounts if _usable(bases[h.key])]
    modes = [wanted] if wanted != "auto" else ["v2", "v1"]
    for mode in modes:
        chosen = select(usable, mode)
        if mode == "v1" and not [h for h in chosen if not h.v2]:
            chosen = []
        if chosen:
            prefixes = tuple(os.path.join(bases[h.key], PREFIX + fleet_id) for h in chosen)
            return Plan(mode, tuple(chosen), prefixes)
    why = "no writable cgroup hierarchy" if not usable else f"no usable {wanted} hierarchy"
    return _no_cgroups(wanted, why)


def _no_cgroups(wanted: str, why: str) -> Plan:
    if wanted in ("v1", "v2"):
        raise SimError(f"cgroup mode {wanted} is not available here: {why}",
                       hint="use --cgroup auto or none")
    return Plan("none", (), (), why)


def record_file(state_dir: Path) -> Path:
    return state_dir / "cgroups.json"


def create(state_dir: Path, fleet: Plan, nodes: dict[str, Path]) -> None:
    """Record the plan, then make the fleet's prefix and each node's root in every
    hierarchy of the plan, and write each node's ``cgroups.tsv`` into its dir (``nodes``:
    name -> dir) for its init."""
    doc = {
        "mode": fleet.mode,
        "why": fleet.why,
        "prefixes": list(fleet.prefixes),
        "hierarchies": [[h.mount, h.fstype, h.key, h.options] for h in fleet.hierarchies],
    }
    tmp = record_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(record_file(state_dir))
    roots: dict[str, list[str]] = {name: [] for name in nodes}
    for hierarchy, prefix in zip(fleet.hierarchies, fleet.prefixes, strict=True):
        os.mkdir(prefix)
        if "cpuset" in hierarchy.key.split(","):
            _inherit_cpuset(prefix)
        for name in nodes:
            root = os.path.join(prefix, name)
            os.mkdir(root)
            roots[name].append(root)
    for name, node_dir in nodes.items():
        (node_dir / nodecg.CONFIG_NAME).write_text(node_config(fleet, roots[name]))


def _inherit_cpuset(prefix: str) -> None:
    # A new v1 cpuset has no CPUs and no memory nodes, and nothing can join it until it has
    # some: copy the parent's, and let every cgroup below do the same (clone_children).
    parent = os.path.dirname(prefix)
    for name in ("cpuset.cpus", "cpuset.mems"):
        value = Path(parent, name).read_text()
        Path(prefix, name).write_text(value)
    Path(prefix, "cgroup.clone_children").write_text("1")


def load(state_dir: Path) -> Plan:
    """The plan recorded for the fleet in ``state_dir`` (mode none if there is none)."""
    try:
        doc = json.loads(record_file(state_dir).read_text())
    except (OSError, ValueError):
        return Plan("none", (), (), "no cgroups recorded")
    hierarchies = tuple(Hierarchy(*h) for h in doc.get("hierarchies", []))
    return Plan(doc["mode"], hierarchies, tuple(doc.get("prefixes", [])), doc.get("why", ""))


def remove(state_dir: Path, timeout: float = REMOVE_TIMEOUT_S) -> list[str]:
    """Remove every cgroup below the recorded prefixes, deepest first, and the prefixes.
    Processes killed a moment ago may still be leaving: retried until ``timeout``.
    Returns the cgroups that could not be removed (they hold a process)."""
    fleet = load(state_dir)
    deadline = time.monotonic() + timeout
    left: list[str] = []
    for prefix in fleet.prefixes:
        if not os.path.basename(prefix).startswith(PREFIX):
            continue  # never anything but our own prefix, whatever the file says
        left += _remove_tree(prefix, deadline)
    if not left:
        record_file(state_dir).unlink(missing_ok=True)
    return left


def _remove_tree(prefix: str, deadline: float) -> list[str]:
    while True:
        busy: list[str] = []
        for top, dirs, _ in os.walk(prefix, topdown=False):
            for name in dirs:
                busy += _rmdir(os.path.join(top, name))
        busy += _rmdir(prefix)
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.02)


def _rmdir(path: str) -> list[str]:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return [path]
        raise
    return []


def leftovers(state_dir: Path) -> list[str]:
    """Cgroups of the fleet in ``state_dir`` that still exist (for tests and status)."""
    return [p for p in load(state_dir).prefixes if os.path.isdir(p)]


def describe(fleet: Plan) -> str:
    """One line for ``sim status``.

    >>> describe(Plan("none", (), (), "no writable cgroup hierarchy"))
    'none (no writable cgroup hierarchy): processes keep the cgroups of sim up'
    """
    if fleet.mode == "none":
        return f"none ({fleet.why}): processes keep the cgroups of sim up"
    where = ", ".join(h.mount for h in fleet.hierarchies)
    if fleet.mode == "v1" and any(h.v2 for h in fleet.hierarchies):
        return f"v1 (hybrid: v1 controllers and cgroup2) in {where}"
    return f"{fleet.mode} in {where}"


def node_config(fleet: Plan, roots: Sequence[str]) -> str:
    """What a node's init reads (``cgroups.tsv`` in its dir, see ``nodecg``): the host
    paths of its roots, and for each hierarchy its key, type, options and where the node
    mounts it."""
    rows = [
        {"key": h.key, "fstype": h.fstype, "options": h.options, "host": root,
         "mount": node_mount(h, fleet.mode)}
        for h, root in zip(fleet.hierarchies, roots, strict=True)
    ]
    return nodecg.format_config(fleet.mode, rows)


def join_argv(roots: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into each of ``roots`` (a node's
    cgroups), so that what it execs starts inside the node's tree; as is with no roots.

    >>> join_argv([], ["true"])
    ['true']
    >>> join_argv(["/cg/a"], ["true"])[-3:]
    ['/cg/a/cgroup.procs', '--', 'true']
    """
    if not roots:
        return list(argv)
    script = ('for f do [ "$f" = -- ] && break; echo 0 >"$f" || exit 126; shift; done; '
              'shift; exec "$@"')
    procs = [os.path.join(r, "cgroup.procs") for r in roots]
    return ["/bin/sh", "-c", script, "sh", *procs, "--", *argv]
