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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fleetclean.errors import SimError
from fleetclean.sim import accounts, cgroups, faults, pids, sshfiles
from fleetclean.sim import node as nodes_mod
from fleetclean.sim import slurm as slurm_mod
from fleetclean.sim.layout import (
    IN_NODE_CODE,
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
# Started in a node as root: its stuck driver (launcher.ensure_stuckfs, once per node).
_START_STUCKFS = (f"import sys; sys.path.insert(0, {str(PACKAGE_DIR)!r}); import launcher; "
                  "launcher.ensure_stuckfs()")
NodeRef = str | SimNode


def check_host() -> None:
    """Raise SimError naming the fix when this machine cannot run a simulated fleet."""
    if platform.system() != "Linux":
        raise SimError("the simulated fleet needs Linux (PID and mount namespaces)")
    if os.geteuid() != 0:
        raise SimError("the simulated fleet needs root (namespaces, mounts, sshd)")
    if not os.access(SSHD, os.X_OK):
        raise SimError(f"{SSHD} not found", hint="install it: apt-get install openssh-server")
    if shutil.which("nsenter") is None:
        raise SimError("nsenter not found", hint="apt-get install util-linux")


class SimFleet:
    """A running simulated fleet, attached to its state dir."""

    def __init__(self, layout: StateLayout, nodes: list[SimNode]) -> None:
        self.layout = layout
        self.nodes = nodes
        # The zygote that started the nodes' inits, so that down() can reap it.
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
    def host_ca_path(self) -> Path | None:
        """The CA key that signs the nodes' host keys; None for a fleet made without
        ``host_ca``."""
        return self.layout.host_ca if self.layout.host_ca.exists() else None

    @property
    def sudo_password(self) -> str:
        """The password of the nodes' login accounts (``users``): what sudo asks alice
        (and bob, before it tells him he may not)."""
        return self.layout.sudo_password.read_text().strip()

    @property
    def users(self) -> tuple[accounts.SimUser, ...]:
        """The nodes' login accounts besides root (see ``accounts``)."""
        return accounts.USERS

    @property
    def slurm_conf_path(self) -> Path | None:
        """The fleet's ``slurm.conf`` (for ``SLURM_CONF``); None without ``--slurm``."""
        if not slurm_mod.has_slurm(self.layout.root):
            return None
        return slurm_mod.slurm_layout(self.layout.root).conf

    @property
    def shared_dir(self) -> Path:
        """A directory every node sees at this same path (made with ``slurm``)."""
        return self.layout.root / "shared"

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
        sshd_defaults: bool = False,
        cgroup: str = "auto",
        gpu_minors: Sequence[int] | None = None,
        slurm_epilog: Path | None = None,
        host_ca: bool = False,
    ) -> SimFleet:
        """Start ``nodes`` nodes in parallel and return once every sshd listens.

        ``subnet`` is the second octet of the addresses (127.SUBNET.x.y), so that two
        fleets can run side by side; ``persistenced`` (the default) starts
        nvidia-persistenced on every node holding every GPU, as on a real datacenter node
        (a node's system daemon: see ``processes``); ``slurm``: also a real Slurm
        (``sim/slurm.py``), returning once every node is idle in it; ``sshd_defaults``: every
        sshd with OpenSSH's own MaxStartups and MaxSessions (see ``sshfiles``); ``cgroup``:
        ``auto``, ``v2``, ``v1`` or ``none`` (see ``sim/cgroups.py``); ``gpu_minors``: GPU
        index i's device file is ``/dev/nvidia{gpu_minors[i]}`` on every node (default: i),
        as when a driver's probe order differs from the bus order; ``slurm_epilog``:
        slurm.conf's ``Epilog=``, relative to the fleet's shared dir (``shared_dir``);
        ``host_ca``: a site with an SSH CA, every node's host key signed by the fleet's CA
        key (``host_ca_path``) and shown by its sshd as a ``HostCertificate``, and
        ``known_hosts`` one ``@cert-authority`` line for the fleet's addresses (see
        ``sshfiles``; ``certify_host_key`` signs one again). Raises
        SimError if the host cannot run a fleet (or Slurm, or that cgroup mode), a fleet is
        already up in ``state_dir``, or an address is taken.
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
        listening = _listening()
        taken = [a for a in addresses if (a, 22) in listening]
        if taken:
            raise SimError(f"port 22 is already in use on {taken[0]}", hint="try another subnet")
        # A fleet that died without `down` may have left its cgroups: they go with it.
        cgroups.remove(layout.root)
        shutil.rmtree(layout.root, ignore_errors=True)
        layout.root.mkdir(parents=True)
        fleet = cls(layout, [])
        try:
            if slurm:
                slurm_mod.prepare(layout.root)
            fleet._start(names, addresses, subnet, sshd_defaults=sshd_defaults, cgroup=cgroup,
                         minors=gpu_minors, persistenced=persistenced, host_ca=host_ca)
            if slurm:
                slurm_mod.start(layout.root, fleet.nodes, subnet, fleet.cgroup_mode,
                                slurm_epilog)
        except BaseException:
            fleet.down()
            raise
        return fleet

    def persistenced_pid(self, ref: NodeRef) -> int | None:
        """The node PID of the nvidia-persistenced that ``up`` started, if it runs."""
        sim_node = self.node(ref)
        try:
            pid = int(self.node_path(sim_node, PERSISTENCED_PID).read_text())
        except (OSError, ValueError):
            return None
        return pid if pid in nodes_mod.system_pids(sim_node.dir) else None

    def _zygote_started(self, proc: subprocess.Popen[bytes]) -> None:
        self._children.append(proc)
        pids.record(self.layout.pid_file, proc.pid, "zygote")

    def _start(
        self, names: list[str], addresses: list[str], subnet: int, *, sshd_defaults: bool,
        cgroup: str, minors: Sequence[int] | None, persistenced: bool, host_ca: bool = False,
    ) -> None:
        layout = self.layout
        fleet_id = secrets.token_hex(8)
        sshfiles.keygen(layout.client_key, "fleetclean-sim-client")
        if host_ca:
            sshfiles.keygen(layout.host_ca, "fleetclean-sim-host-ca")
        client_pub = sshfiles.public_key(layout.client_key)
        password = accounts.new_password()
        fd = os.open(layout.sudo_password, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        password_hash = accounts.crypt_sha512(password)
        dirs = [layout.node_dir(n) for n in names]

        def prepare(index: int) -> None:
            nodes_mod.prepare(dirs[index], names[index], addresses[index], fleet_id, client_pub,
                              password_hash=password_hash, sshd_defaults=sshd_defaults,
                              minors=minors, host_ca=layout.host_ca if host_ca else None)

        # Files (about twenty a node) and a host key each: a few nodes at a time overlap
        # their file system waits.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(prepare, range(len(names))))
        cg_plan = cgroups.plan(fleet_id, cgroup)
        cgroups.create(layout.root, cg_plan, dict(zip(names, dirs, strict=True)))
        started = nodes_mod.start_inits(
            list(zip(dirs, addresses, strict=True)), layout.pid_file,
            persistenced=persistenced, on_start=self._zygote_started)
        for name, address, node_dir in zip(names, addresses, dirs, strict=True):
            self.nodes.append(SimNode(name, address, started[name], node_dir))
        for sim_node in self.nodes:
            nodes_mod.wait_listener(sim_node, 1)
        if host_ca:
            sshfiles.write_cert_authority(layout.known_hosts, layout.host_ca, f"127.{subnet}.*")
        else:
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
            "cgroup": cg_plan.mode,
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
        everything inside their namespaces), reap, remove the fleet's cgroups and the
        state dir. Idempotent. Raises SimError, leaving the state dir, if some process
        would not die or some cgroup of the fleet still holds a process."""
        left = pids.kill_all(pids.load(self.layout.pid_file))
        for child in self._children:
            child.wait()
        self._children.clear()
        if left:
            listed = ", ".join(f"{e.pid} ({e.role})" for e in left)
            raise SimError(f"these simulator processes would not die: {listed}")
        busy = cgroups.remove(self.layout.root)
        if busy:
            raise SimError(f"cgroups of the fleet still hold processes: {', '.join(busy[:3])}")
        shutil.rmtree(self.layout.root, ignore_errors=True)

    @property
    def cgroup_mode(self) -> str:
        """``v2``, ``v1`` or ``none``: how the fleet's nodes have cgroups."""
        return cgroups.load(self.layout.root).mode

    @property
    def cgroup_description(self) -> str:
        """The mode and where, in one line (``v2 in /sys/fs/cgroup/unified``)."""
        return cgroups.describe(cgroups.load(self.layout.root))

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
        """``sshd``, ``off``, ``blackhole``, an SSH fault's (``faults.SSH_FAULTS``) or
        ``error``; ``stopped`` when the node is."""
        sim_node = self.node(ref)
        if not self.is_running(sim_node):
            return "stopped"
        return nodes_mod.listener_state(sim_node.dir)[1]

    def run_in(
        self,
        ref: NodeRef,
        argv: list[str],
        input: str | None = None,
        timeout: float = 60,
        where: str = "",
        *,
        user: str = "root",
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node (its PID, mount and cgroup namespaces, no SSH) as
        ``user`` (root or one of ``users``), for test setup and assertions; text output
        captured, never raises on a non-zero exit. It runs at the root of the node's cgroup
        tree, or in the unit ``where``."""
        sim_node = self.node(ref)
        if not self.is_running(sim_node):
            raise SimError(f"{sim_node.name} is not running")
        try:
            argv = nodes_mod.nsenter(sim_node, argv, where, user=user)
        except KeyError as exc:
            raise SimError(f"no account {user!r} on the simulated nodes") from exc
        return subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=nodes_mod.node_env(user),
            cwd="/",
            timeout=timeout,
            check=False,
        )

    def spawn(self, ref: NodeRef, kind: str, *, user: str = "root", **opts: Any) -> list[int]:
        """Start workload ``kind`` in the node as ``user`` and return its node PIDs, root
        first, once every one of its processes holds its devices.

        Kinds: ``sglang``, ``vllm``, ``trtllm``, ``triton``, ``tgi``, ``ray`` (gpus="0-7",
        mib, model_path, port), ``zombie-parent`` (gpus="0-1", mib), ``stubborn`` (gpu,
        mib, name), ``slow`` (gpu, delay, mib, name), ``orphan`` (gpu, mib, name),
        ``stuck`` (gpu, mib, name: state D once killed, until the ``unstick`` fault),
        ``stuck-thread`` (gpu, mib, name: the same wait in a second thread; once killed, the
        main thread a zombie, that thread in state D and the GPU held, as ``stuck``),
        ``pthread-exit`` (gpu, mib, name, thread="work"|"driver": alive, its main thread
        ended by pthread_exit, a zombie with no command line, while a second thread works
        on holding the GPU, or waits in the stuck driver: killed, it is ``stuck-thread``),
        ``slow-exit`` (gpu, delay, mib, name: once killed, DELAY seconds in its exit),
        ``monitor`` (name), ``persistenced`` (name, devices="ctl"|"all"), ``writer``
        (path), ``respawn`` (gpu, delay, mib), ``holder`` (gpus, mib, name; sees="all":
        every GPU's file open, memory on its own GPUs only, as CUDA where no
        CUDA_VISIBLE_DEVICES or device cgroup narrows what it sees), ``exec`` (argv,
        files, uid, tty: a real program, such as ``tail -f``, ``less`` or ``vim``, in a
        session of its own; the program's PID, then its terminal's holder with ``tty``); and
        under a supervisor, running kind ``run`` (``holder`` by default): ``service``,
        ``container`` (``rootless="alice"``: by that user's rootless docker daemon),
        ``podman`` (a Podman container under its conmon; ``rootless="alice"``: hers),
        ``pod``, ``tmux``, ``screen``, ``slurm-job`` (``sim/supervised.py``).
        ``system=True`` marks the processes as the node's own daemons (left out of
        ``processes``).
        """
        if kind == "slurm-job" and "slurm_conf" not in opts:
            conf = self.slurm_conf_path
            if conf is None:
                raise SimError("a slurm-job needs a fleet with Slurm", hint="sim up --slurm")
            opts["slurm_conf"] = str(conf)
        # The code as the node binds it, which every account can read.
        code = PACKAGE_DIR if user == "root" else IN_NODE_CODE
        argv = [node_python(), f"{code}/launcher.py", kind, json.dumps(opts)]
        done = self.run_in(ref, argv, where=_session_scope(user), user=user)
        if done.returncode != 0:
            raise SimError(f"spawn {kind} in {self.node(ref).name} failed: {done.stderr.strip()}")
        started: list[int] = json.loads(done.stdout)
        return started

    def spawn_all(self, refs: Sequence[NodeRef], kind: str, **opts: Any) -> dict[str, list[int]]:
        """``spawn`` on every node of ``refs``, a few at a time (each is an nsenter and two
        interpreter start-ups: CPU-bound); node name -> its PIDs."""
        def one(ref: NodeRef) -> tuple[str, list[int]]:
            return self.node(ref).name, self.spawn(ref, kind, **opts)

        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(one, refs))

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

    def gpu_used_all(self, refs: Sequence[NodeRef]) -> dict[str, list[int]]:
        """``gpu_used_mib`` of every node of ``refs``, a few at a time (each is an nsenter
        and the fake nvidia-smi's start-up); node name -> used MiB per GPU."""
        def one(ref: NodeRef) -> tuple[str, list[int]]:
            return self.node(ref).name, self.gpu_used_mib(ref)

        with ThreadPoolExecutor(max_workers=4) as pool:
            return dict(pool.map(one, refs))

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
            if not 0 <= delay < 3600:  # nan, inf and negatives too: no sleep takes them
                raise SimError(f"bad seconds {seconds!r}: 0 up to an hour",
                               hint=faults.usage(fault))
            self._listen(sim_node, fault, delay)
            return
        if fault == "hang":  # nvidia-smi waits on the node's stuck driver
            started = self.run_in(sim_node, [node_python(), "-S", "-c", _START_STUCKFS])
            if started.returncode != 0:
                raise SimError(f"{sim_node.name}: its stuck driver did not start: "
                               f"{started.stderr.strip()}")
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

    def set_sshd_limits(self, ref: NodeRef, max_startups: str | None = None,
                        max_sessions: int | None = None) -> None:
        """Restart the node's sshd with these ``MaxStartups`` (``"10:30:100"``, ``"2"``) and
        ``MaxSessions``; None is OpenSSH's own default (10:30:100, 10), so no argument gives
        a stock sshd. Sessions already open keep running."""
        sim_node = self.node(ref)
        nodes_mod.write_sshd_configs(sim_node.dir, sim_node.address, max_startups,
                                     max_sessions)
        self._listen(sim_node, "sshd")

    def rotate_host_key(self, ref: NodeRef) -> None:
        """New host key and sshd restarted; known_hosts keeps the old key, so clients
        that check host keys now see a mismatch. A certificate of the old key goes with it
        (a reinstalled node that its CA has not signed yet)."""
        sim_node = self.node(ref)
        sshfiles.keygen(sim_node.dir / sshfiles.HOST_KEY, f"root@{sim_node.name}")
        (sim_node.dir / sshfiles.HOST_CERT).unlink(missing_ok=True)
        nodes_mod.show_certificate(sim_node.dir)
        self._listen(sim_node, "sshd")

    def certify_host_key(self, ref: NodeRef, *, principals: Sequence[str] | None = None,
                         validity: str | None = None, ca: Path | None = None) -> Path:
        """Sign the node's host key again (real ``ssh-keygen -s -h``) and restart its sshd
        showing that certificate: ``principals`` (default: its name and address; () none),
        ``validity`` as ``ssh-keygen -V`` takes it (default forever), ``ca`` the CA's
        private key (default the fleet's, ``host_ca_path``). Returns the certificate."""
        sim_node = self.node(ref)
        signer = ca or self.host_ca_path
        if signer is None:
            raise SimError("this fleet has no host CA: give ca=, or start it with host_ca")
        names = (sim_node.name, sim_node.address) if principals is None else principals
        cert = sshfiles.sign_host_key(signer, sim_node.dir, f"{sim_node.name} host key",
                                      names, validity)
        nodes_mod.show_certificate(sim_node.dir)
        self._listen(sim_node, "sshd")
        return cert

    def _listen(self, ref: NodeRef, mode: str, seconds: float = 0) -> None:
        sim_node = self.node(ref)
        nodes_mod.set_listener(sim_node, self._init(sim_node), mode, seconds)


def _is_listening(address: str, port: int = 22) -> bool:
    """Same check as the node init: /proc/net/tcp, no probe connection."""
    return (address, port) in _listening()


def _listening() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the machine, in one read."""
    found = set()
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            fields = line.split()
            if fields[3] == "0A":
                host, port = fields[1].split(":")
                address = ".".join(str(b) for b in int(host, 16).to_bytes(4, "little"))
                found.add((address, int(port, 16)))
    return found


def _session_scope(user: str) -> str:
    """Where another account's processes live: its own login session, as pam_systemd puts
    them (root's launcher moves itself to root's); SimError for an unknown account."""
    if user == "root":
        return ""
    try:
        uid = accounts.user(user).uid
    except KeyError as exc:
        raise SimError(f"no account {user!r} on the simulated nodes") from exc
    return f"user.slice/user-{uid}.slice/session-2.scope"
