"""A real Slurm for a simulated fleet: one ``munged``, one ``slurmctld``, a ``slurmd`` per node.

``fleetclean sim up --slurm`` calls ``prepare`` before the nodes start (the shared dir
must exist when a node's init binds it) and ``start`` once they listen. Every daemon is
recorded in the fleet's PID file, so ``sim down`` stops them by PID like the rest: the
``slurmd``s and their ``slurmstepd``s live inside the nodes' PID namespaces and die with
them. Each is the fleet's own instance, with its own key, socket, ports and state, never
this machine's services.

Example::

    fleet = SimFleet.up(nodes=2, slurm=True)
    env = slurm_env(fleet.state_dir)           # SLURM_CONF=STATE/shared/slurm/slurm.conf
    subprocess.run(["sinfo"], env=env)          # gpu* up infinite 2 idle node[01-02]
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fleetclean.errors import SimError
from fleetclean.sim import node as nodes_mod
from fleetclean.sim import pids
from fleetclean.sim.layout import StateLayout
from fleetclean.sim.node import SimNode
from fleetclean.sim.slurm_conf import (
    FIRST_PORT,
    SlurmLayout,
    SlurmNode,
    cgroup_conf,
    free_ports,
    gres_conf,
    listening_ports,
    slurm_conf,
)

DAEMONS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmstepd": "slurmd",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "srun": "slurm-client",
}
START_TIMEOUT_S = 45.0


def slurm_layout(state_dir: Path) -> SlurmLayout:
    return SlurmLayout(StateLayout(state_dir).root / "shared")


def has_slurm(state_dir: Path) -> bool:
    """True when the fleet in ``state_dir`` was started with ``--slurm``."""
    return slurm_layout(state_dir).conf.exists()


def slurm_env(state_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) plus the fleet's ``SLURM_CONF``."""
    env = dict(os.environ if base is None else base)
    env["SLURM_CONF"] = str(slurm_layout(state_dir).conf)
    return env


def missing() -> list[str]:
    """Debian packages to install before a fleet can run Slurm ([] when none)."""
    lacking = {pkg for tool, pkg in DAEMONS.items() if shutil.which(tool) is None}
    for tool in ("munged", "slurmctld", "slurmd", "slurmstepd"):
        if shutil.which(tool) is None and os.access(f"/usr/sbin/{tool}", os.X_OK):
            lacking.discard(DAEMONS[tool])
    return sorted(lacking)


def check() -> None:
    """SimError naming the fix when Slurm is missing or its parts disagree on the version."""
    lacking = missing()
    if lacking:
        raise SimError(
            f"Slurm is not installed ({', '.join(lacking)} missing)",
            hint=f"apt-get install {' '.join(lacking)}, or run scripts/dev setup",
        )
    versions = {tool: _version(tool) for tool in ("slurmctld", "slurmd")}
    if len(set(versions.values())) != 1:
        listed = ", ".join(f"{t} {v}" for t, v in versions.items())
        raise SimError(f"Slurm's parts disagree on the version: {listed}")


def _version(tool: str) -> str:
    path = shutil.which(tool) or f"/usr/sbin/{tool}"
    done = subprocess.run([path, "-V"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip() or "unknown"


def prepare(state_dir: Path) -> None:
    """Create the shared dir; it must exist before the nodes start to be bound in them."""
    layout = slurm_layout(state_dir)
    for path in (layout.dir, layout.ctld_state, layout.munge_dir):
        path.mkdir(parents=True, exist_ok=True)
        # munged refuses a key or socket dir that others could write to.
        path.chmod(0o755)


def start(state_dir: Path, nodes: Sequence[SimNode], subnet: int = 0,
          cgroup_mode: str = "none", epilog: Path | None = None) -> None:
    """Write the config, start munged, slurmctld and every slurmd, and wait until
    ``sinfo`` shows every node idle. Raises SimError (with the log that says why) when a
    daemon will not start; the caller takes the fleet down. ``epilog``: slurm.conf's
    ``Epilog=``, a path under the fleet's shared dir (so every node sees it); a no-op
    script is put there until the caller writes its own."""
    layout = slurm_layout(state_dir)
    pid_file = StateLayout(state_dir).pid_file
    # Fleets on other subnets start their search elsewhere, so two coming up at once
    # rarely reach for the same free ports.
    ports = free_ports(len(nodes) + 1, listening_ports(), FIRST_PORT + (subnet * 97) % 16000)
    slurm_nodes = [
        SlurmNode(n.name, n.address, port) for n, port in zip(nodes, ports[1:], strict=True)
    ]
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    if epilog is not None:
        epilog = _shared_path(layout, epilog)
        if not epilog.exists():
            epilog.parent.mkdir(parents=True, exist_ok=True)
            epilog.write_text("#!/bin/sh\nexit 0\n")
            epilog.chmod(0o755)
    conf = slurm_conf(layout, host, ports[0], slurm_nodes, cpus, cgroup_mode=cgroup_mode,
                      epilog=str(epilog) if epilog else None)
    nodes_mod.write_atomic(layout.conf, conf)
    nodes_mod.write_atomic(layout.dir / "cgroup.conf", cgroup_conf(cgroup_mode))
    nodes_mod.write_atomic(layout.gres, gres_conf(slurm_nodes))
    deadline = time.monotonic() + START_TIMEOUT_S
    _start_munged(layout, pid_file, deadline)
    _start_slurmctld(layout, pid_file, ports[0], deadline)
    for sim_node in nodes:
        _start_slurmd(layout, pid_file, sim_node)
    for sim_node in nodes:
        _record_slurmd(pid_file, sim_node, deadline)
    _wait_idle(state_dir, [n.name for n in nodes], deadline)


def _shared_path(layout: SlurmLayout, path: Path) -> Path:
    """``path`` (relative: under the shared dir), refused outside it, where no node sees it."""
    full = (layout.shared / path).resolve()
    if not full.is_relative_to(layout.shared.resolve()):
        raise SimError(f"the epilog must live under {layout.shared}, where every node sees it",
                       hint="give a path relative to it, e.g. --epilog epilog/fleetclean")
    return full


def _daemon(argv: list[str], log: Path, pid_file: Path, role: str) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pids.record(pid_file, proc.pid, role)
    return proc.pid


def _start_munged(layout: SlurmLayout, pid_file: Path, deadline: float) -> None:
    key = layout.munge_key
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    argv = [
        shutil.which("munged") or "/usr/sbin/munged",
        "--foreground",
        "--force",
        f"--socket={layout.munge_socket}",
        f"--key-file={key}",
        f"--pid-file={layout.munge_dir / 'munged.pid'}",
        f"--log-file={layout.munge_log}",
        f"--seed-file={layout.munge_dir / 'munged.seed'}",
    ]
    pid = _daemon(argv, layout.munge_dir / "munged.out", pid_file, "munged")
    _wait(layout.munge_socket.exists, pid, "munged", layout.munge_log, deadline)


def _start_slurmctld(layout: SlurmLayout, pid_file: Path, port: int, deadline: float) -> None:
    argv = [shutil.which("slurmctld") or "/usr/sbin/slurmctld", "-D", "-i", "-f", str(layout.conf)]
    pid = _daemon(argv, layout.dir / "slurmctld.out", pid_file, "slurmctld")
    _wait(lambda: port in listening_ports(), pid, "slurmctld", layout.ctld_log, deadline)


def _wait(ready: Callable[[], bool], pid: int, what: str, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if ready():
            return
        fields = pids.stat_fields(pid)
        if fields is None or fields[0] == "Z":
            raise SimError(f"{what} exited at start; {_tail(log)}")
        time.sleep(0.02)
    raise SimError(f"{what} not ready after {START_TIMEOUT_S:.0f} s; {_tail(log)}")


def _start_slurmd(layout: SlurmLayout, pid_file: Path, sim_node: SimNode) -> None:
    """slurmd daemonizes: its parent (under nsenter) exits and the daemon is reparented to
    the node's init, inside the node's PID, mount and UTS namespaces (hostname nodeNN)."""
    (sim_node.dir / "slurmd").mkdir(exist_ok=True)
    (sim_node.dir / "slurmd.pid").unlink(missing_ok=True)
    slurmd = ["/usr/sbin/slurmd", "-f", str(layout.conf), "-N", sim_node.name]
    argv = nodes_mod.nsenter(sim_node, slurmd, "system.slice/slurmd.service", uts=True)
    done = subprocess.run(
        argv, env=nodes_mod.node_env(), capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        why = f"{done.stderr.strip()}; {_tail(sim_node.dir / 'slurmd.log')}"
        raise SimError(f"{sim_node.name}: slurmd did not start: {why}")


def _record_slurmd(pid_file: Path, sim_node: SimNode, deadline: float) -> None:
    log = sim_node.dir / "slurmd.log"
    pid_path = sim_node.dir / "slurmd.pid"
    while time.monotonic() < deadline:
        try:
            node_pid = int(pid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.02)
            continue
        for proc in nodes_mod.processes(sim_node, include_system=True):
            if proc.pid == node_pid:
                pids.record(pid_file, proc.host_pid, f"slurmd:{sim_node.name}")
                return
        raise SimError(f"{sim_node.name}: slurmd exited at start; {_tail(log)}")
    raise SimError(f"{sim_node.name}: slurmd wrote no PID file; {_tail(log)}")


def _wait_idle(state_dir: Path, names: list[str], deadline: float) -> None:
    """Until every node has registered and is idle (bounded by ``deadline``)."""
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(state_dir)
        if all(states.get(n) == "idle" for n in names):
            return
        time.sleep(0.1)
    late = ", ".join(f"{n} {states.get(n, 'absent')}" for n in names if states.get(n) != "idle")
    log = slurm_layout(state_dir).ctld_log
    raise SimError(f"Slurm nodes not idle after {START_TIMEOUT_S:.0f} s: {late}; {_tail(log)}")


def node_states(state_dir: Path) -> dict[str, str]:
    """``{node: state}`` as ``sinfo`` reports it now ({} when it cannot)."""
    argv = ["sinfo", "-N", "-h", "-o", "%N %T"]
    try:
        done = subprocess.run(
            argv, env=slurm_env(state_dir), capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states: dict[str, str] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"no log at {log}"
    return f"{log.name}: " + (" | ".join(lines[-3:]) if lines else "(empty)")
