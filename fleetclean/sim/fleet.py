"""``SimFleet``: bring a simulated fleet up, drive it, and take it down by PID.

Example::

    fleet = SimFleet.up(nodes=2, state_dir=Path("/tmp/sim"))
    fleet.spawn("node01", "sglang")          # -> [35, 36, ..., 44], node01's PIDs
    subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), "node01", "nvidia-smi"])
    fleet.down()                              # every process started, killed by PID

``up`` refuses a state dir where a fleet is still running (``SimError``), and takes down
what it started if any node fails to come up. ``down`` is idempotent and works from any
process: it reads the PIDs recorded in the state dir.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleetclean.errors import SimError
from fleetclean.sim import faults, pids, sshfiles
from fleetclean.sim import node as nodes_mod
from fleetclean.sim import slurm as slurm_mod
from fleetclean.sim.layout import (
    PACKAGE_DIR,
    StateLayout,
    default_state_dir,
    node_address,
    node_name,
    node_python,
)
from fleetclean.sim.node import SimNode, SimProcess

SSHD = "/usr/sbin/sshd"
PERSISTENCED_PID = "/run/nvidia-persistenced/nvidia-persistenced.pid"
STUCKFS_PID = "/run/fleetclean-stuckfs.pid"  # stuckfs.PID_FILE
NodeRef = str | SimNode


def check_host() -> None:
    """Raise SimError naming the fix when this machine cannot run a simulated fleet."""
    if platform.system() != "Linux":
        raise SimError("the simulated fleet needs Linux (PID and mount namespaces)")
    if os.geteuid() != 0:
        raise SimError("the simulated fleet needs root (namespaces, mounts, sshd)")
    if not os.access(SSHD, os.X_OK):
        raise SimError(f"{SSHD} not found", hint="install it: apt-get install openssh-server")
    for tool in ("unshare", "nsenter", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise SimError(f"{tool} not found", hint="apt-get install util-linux openssh-client")


class SimFleet:
    """A running simulated fleet, attached to its state dir."""

    def __init__(self, layout: StateLayout, nodes: list[SimNode]) -> None:
        self.layout = layout
        self.nodes = nodes
        # unshare processes we started ourselves, so that down() can reap them.
        self._children: list[subprocess.Popen[bytes]] = []

    # -- files a client uses -------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self.layout.root

    @property
    def inventory_path(self) -> Path:
        return self.layout.inventory

    @property
    def ssh_config_path(self) -> Path:
        return self.layout.ssh_config

    @property
    def known_hosts_path(self) -> Path:
        return self.layout.known_hosts

    @property
    def client_key_path(self) -> Path:
        return self.layout.client_key

    @property
    def slurm_conf_path(self) -> Path | None:
        """The fleet's ``slurm.conf`` (for ``SLURM_CONF``); None without ``--slurm``."""
        if not slurm_mod.has_slurm(self.layout.root):
            return None
        return slurm_mod.slurm_layout(self.layout.root).conf

    # -- life cycle ----------------------------------------------------------------

    @classmethod
    def up(
        cls,
        nodes: int = 8,
        state_dir: Path | None = None,
        *,
        subnet: int = 0,
        persistenced: bool = True,
        slurm: bool = False,
    ) -> SimFleet:
        """Start ``nodes`` nodes in parallel and return once every sshd listens.

        ``subnet`` is the second octet of the addresses (127.SUBNET.x.y), so that two
        fleets can run side by side; ``persistenced`` (the default) starts
        nvidia-persistenced on every node holding every GPU, as on a real datacenter node
        (a node's system daemon: see ``processes``); ``slurm``: also a real Slurm
        (``sim/slurm.py``),
        returning once every node is idle in it. Raises SimError if the host cannot run a
        fleet (or Slurm), a fleet is already up in ``state_dir``, or an address is taken.
        """
        check_host()
        if slurm:
            slurm_mod.check()
        if nodes < 1:
            raise SimError(f"a fleet needs at least one node, not {nodes}")
        layout = StateLayout(Path(state_dir or default_state_dir()).resolve())
        if any(pids.is_alive(e) for e in pids.load(layout.pid_file)):
            raise SimError(
                f"a simulated fleet is already up in {layout.root}",
                hint="stop it with `fleetclean sim down` or pick another --state-dir",
            )
        names = [node_name(i) for i in range(1, nodes + 1)]
        addresses = [node_address(i, subnet) for i in range(1, nodes + 1)]
        taken = [a for a in addresses if _is_listening(a)]
        if taken:
            raise SimError(f"port 22 is already in use on {taken[0]}", hint="try another subnet")
        shutil.rmtree(layout.root, ignore_errors=True)
        layout.root.mkdir(parents=True)
        fleet = cls(layout, [])
        try:
            if slurm:
                slurm_mod.prepare(layout.root)
            fleet._start(names, addresses, subnet)
            if persistenced:
                fleet._start_persistenced()
            if slurm:
                slurm_mod.start(layout.root, fleet.nodes, subnet)
        except BaseException:
            fleet.down()
            raise
        return fleet

    def _start_persistenced(self) -> None:
        # One spawn (an nsenter and an interpreter) per node: a few at a time keep both
        # cores busy without a burst of 64 interpreters.
        def one(sim_node: SimNode) -> None:
            self.spawn(sim_node, "persistenced", devices="all", system=True)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one, self.nodes))

    def persistenced_pid(self, ref: NodeRef) -> int | None:
        """The node PID of the nvidia-persistenced that ``up`` started, if it runs."""
        sim_node = self.node(ref)
        try:
            pid = int(self.node_path(sim_node, PERSISTENCED_PID).read_text())
        except (OSError, ValueError):
            return None
        return pid if pid in nodes_mod.system_pids(sim_node.dir) else None

    def _start(self, names: list[str], addresses: list[str], subnet: int) -> None:
        layout = self.layout
        fleet_id = secrets.token_hex(8)
        sshfiles.keygen(layout.client_key, "fleetclean-sim-client")
        client_pub = sshfiles.public_key(layout.client_key)
        dirs = [layout.node_dir(n) for n in names]

        def prepare(index: int) -> None:
            nodes_mod.prepare(dirs[index], names[index], addresses[index], fleet_id, client_pub)

        # ssh-keygen dominates preparation; a few at a time keep both cores busy.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(prepare, range(len(names))))
        for name, address, node_dir in zip(names, addresses, dirs, strict=True):
            proc = nodes_mod.start_init(node_dir, address)
            self._children.append(proc)
            pids.record(layout.pid_file, proc.pid, f"unshare:{name}")
            init_pid = nodes_mod.find_init(proc.pid)
            pids.record(layout.pid_file, init_pid, f"init:{name}")
            self.nodes.append(SimNode(name, address, init_pid, node_dir))
        for sim_node in self.nodes:
            nodes_mod.wait_listener(sim_node, 1)
        sshfiles.write_known_hosts(layout.known_hosts, self.nodes)
        sshfiles.write_ssh_config(
            layout.ssh_config, self.nodes, layout.client_key, layout.known_hosts
        )
        sshfiles.write_inventory(
            layout.inventory, self.nodes, layout.client_key, layout.known_hosts
        )
        doc = {
            "fleet_id": fleet_id,
            "subnet": subnet,
            "nodes": [
                {"name": n.name, "address": n.address, "init_pid": n.init_pid, "dir": str(n.dir)}
                for n in self.nodes
            ],
        }
        nodes_mod.write_atomic(layout.fleet_file, json.dumps(doc, indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path | None = None) -> SimFleet:
        """Attach to a fleet another process started; SimError if none is up there."""
        layout = StateLayout(Path(state_dir or default_state_dir()).resolve())
        try:
            doc: dict[str, Any] = json.loads(layout.fleet_file.read_text())
        except (OSError, ValueError) as exc:
            raise SimError(
                f"no simulated fleet in {layout.root}", hint="start one with `fleetclean sim up`"
            ) from exc
        nodes = [
            SimNode(n["name"], n["address"], int(n["init_pid"]), Path(n["dir"]))
            for n in doc["nodes"]
        ]
        return cls(layout, nodes)

    def down(self) -> None:
        """Kill every recorded process by PID (node inits first: the kernel then kills
        everything inside their namespaces), reap, and remove the state dir. Idempotent.
        Raises SimError, leaving the state dir, if some process would not die."""
        left = pids.kill_all(pids.load(self.layout.pid_file))
        for child in self._children:
            child.wait()
        self._children.clear()
        if left:
            listed = ", ".join(f"{e.pid} ({e.role})" for e in left)
            raise SimError(f"these simulator processes would not die: {listed}")
        shutil.rmtree(self.layout.root, ignore_errors=True)

    @classmethod
    def down_dir(cls, state_dir: Path | None = None) -> Path:
        """``down`` for whatever is in ``state_dir``, even when ``up`` crashed before it
        wrote fleet.json: the PID file alone is enough. Returns the state dir."""
        fleet = cls(StateLayout(Path(state_dir or default_state_dir()).resolve()), [])
        fleet.down()
        return fleet.state_dir

    def __enter__(self) -> SimFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- one node ------------------------------------------------------------------

    def node(self, ref: NodeRef) -> SimNode:
        """The node named ``ref`` (or ``ref`` itself); SimError if there is none."""
        name = ref.name if isinstance(ref, SimNode) else ref
        for sim_node in self.nodes:
            if sim_node.name == name:
                return sim_node
        raise SimError(f"no node {name!r} in this fleet ({len(self.nodes)} nodes)")

    def _init(self, sim_node: SimNode) -> pids.Recorded:
        for entry in pids.load(self.layout.pid_file):
            if entry.pid == sim_node.init_pid and entry.role == f"init:{sim_node.name}":
                return entry
        raise SimError(f"{sim_node.name}: its init is not recorded in {self.layout.pid_file}")

    def is_running(self, ref: NodeRef) -> bool:
        """True while the node's namespace (its init) is alive."""
        return pids.is_alive(self._init(self.node(ref)))

    def sshd_up(self, ref: NodeRef) -> bool:
        sim_node = self.node(ref)
        return self.is_running(sim_node) and _is_listening(sim_node.address)

    def listener_mode(self, ref: NodeRef) -> str:
        """``sshd``, ``off``, ``blackhole`` or ``error``; ``stopped`` when the node is."""
        sim_node = self.node(ref)
        if not self.is_running(sim_node):
            return "stopped"
        return nodes_mod.listener_state(sim_node.dir)[1]

    def run_in(
        self, ref: NodeRef, argv: list[str], input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node (its PID and mount namespaces, no SSH), for test
        setup and assertions; text output captured, never raises on a non-zero exit."""
        sim_node = self.node(ref)
        if not self.is_running(sim_node):
            raise SimError(f"{sim_node.name} is not running")
        return subprocess.run(
            nodes_mod.nsenter(sim_node, argv),
            input=input,
            capture_output=True,
            text=True,
            env=nodes_mod.node_env(),
            timeout=timeout,
            check=False,
        )

    def spawn(self, ref: NodeRef, kind: str, **opts: Any) -> list[int]:
        """Start workload ``kind`` in the node and return its node PIDs, root first, once
        every one of its processes holds its devices.

        Kinds: ``sglang``, ``vllm``, ``trtllm``, ``triton``, ``tgi``, ``ray`` (gpus="0-7",
        mib, model_path, port), ``zombie-parent`` (gpus="0-1", mib), ``stubborn`` (gpu,
        mib, name), ``slow`` (gpu, delay, mib, name), ``orphan`` (gpu, mib, name),
        ``stuck`` (gpu, mib, name: state D once killed, until the ``unstick`` fault),
        ``slow-exit`` (gpu, delay, mib, name: once killed, DELAY seconds in its exit),
        ``monitor`` (name), ``persistenced`` (name, devices="ctl"|"all"), ``writer``
        (path), ``respawn`` (gpu, mib), ``exec`` (argv, files, user, tty: a real program,
        such as ``tail -f``, ``less`` or ``vim``, in a session of its own; the program's
        PID, then its terminal's holder with ``tty``). ``system=True`` marks the processes
        as the node's own daemons (left out of ``processes``).
        """
        argv = [node_python(), str(PACKAGE_DIR / "launcher.py"), kind, json.dumps(opts)]
        done = self.run_in(ref, argv)
        if done.returncode != 0:
            raise SimError(f"spawn {kind} in {self.node(ref).name} failed: {done.stderr.strip()}")
        started: list[int] = json.loads(done.stdout)
        return started

    def processes(self, ref: NodeRef, include_system: bool = False) -> list[SimProcess]:
        """What runs in the node (init and the SSH listener only with include_system)."""
        return nodes_mod.processes(self.node(ref), include_system)

    def node_path(self, ref: NodeRef, path: str) -> Path:
        """Host path of ``path`` inside the node's mount namespace (``/tmp/x`` ->
        ``/proc/INIT/root/tmp/x``); valid while the node runs."""
        return Path(f"/proc/{self.node(ref).init_pid}/root") / path.lstrip("/")

    def gpu_used_mib(self, ref: NodeRef) -> list[int]:
        """Used MiB per GPU, as the node's nvidia-smi reports it ([] if it cannot)."""
        done = self.run_in(
            ref,
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        )
        try:
            return [int(v) for v in done.stdout.split()] if done.returncode == 0 else []
        except ValueError:
            return []

    # -- faults --------------------------------------------------------------------

    def set_fault(self, ref: NodeRef, fault: str, *args: str | int | float) -> None:
        """Set one fault of ``faults.FAULTS`` on the node, e.g. ``set_fault(n, "lost", 5)``,
        ``set_fault(n, "leak", 5, 512)``, ``set_fault(n, "slow-auth", 3)``; ``none``
        clears every fault but leaks. SimError for a bad fault or argument."""
        sim_node = self.node(ref)
        words = [str(a) for a in args]
        if fault == "unstick":
            # The stuck driver answers every request it held with EIO (stuckfs.py).
            self.run_in(sim_node, ["sh", "-c", f"kill -USR1 $(cat {STUCKFS_PID}) 2>/dev/null"])
            return
        if fault in faults.SSH_FAULTS:
            seconds = words[0] if words else "0"
            try:
                delay = float(seconds)
            except ValueError as exc:
                raise SimError(f"bad seconds {seconds!r}", hint=faults.usage(fault)) from exc
            self._listen(sim_node, fault, delay)
            return
        nodes_mod.set_fault(sim_node.dir, fault, words)
        if fault == "none" and self.listener_mode(sim_node) in faults.SSH_FAULTS:
            self._listen(sim_node, "sshd")

    def stop_node(self, ref: NodeRef) -> None:
        """Stop the node's sshd: connections are refused; its processes keep running."""
        self._listen(ref, "off")

    def start_node(self, ref: NodeRef) -> None:
        """(Re)start the node's sshd."""
        self._listen(ref, "sshd")

    def blackhole(self, ref: NodeRef) -> None:
        """Replace sshd by a listener that accepts connections and never answers."""
        self._listen(ref, "blackhole")

    def rotate_host_key(self, ref: NodeRef) -> None:
        """New host key and sshd restarted; known_hosts keeps the old key, so clients
        that check host keys now see a mismatch."""
        sim_node = self.node(ref)
        sshfiles.keygen(sim_node.dir / sshfiles.HOST_KEY, f"root@{sim_node.name}")
        self._listen(sim_node, "sshd")

    def _listen(self, ref: NodeRef, mode: str, seconds: float = 0) -> None:
        sim_node = self.node(ref)
        nodes_mod.set_listener(sim_node, self._init(sim_node), mode, seconds)


def _is_listening(address: str, port: int = 22) -> bool:
    """Same check as the node init: /proc/net/tcp, no probe connection."""
    octets = [int(o) for o in address.split(".")]
    want = "{:08X}:{:04X}".format(int.from_bytes(bytes(octets), "little"), port)
    with open("/proc/net/tcp") as f:
        return any(line.split()[1] == want and line.split()[3] == "0A" for line in list(f)[1:])
