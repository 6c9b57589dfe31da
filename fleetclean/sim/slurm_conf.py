"""The files of a simulated fleet's Slurm: paths, ports and ``slurm.conf``/``gres.conf``. Pure.

Everything lives under the fleet's shared dir (``STATE/shared``), which every node sees at
the same path (``node_init`` binds it back over the node's private /tmp), so one
``slurm.conf`` serves ``slurmctld`` on this machine, each node's ``slurmd`` and the clients
(``SLURM_CONF=STATE/shared/slurm/slurm.conf sinfo``). Paths a node's ``slurmd`` writes to
are under ``/run/fleetclean``, which is a different directory in every node (its own
``nodes/nodeNN``).

Example::

    >>> layout = SlurmLayout(Path("/tmp/sim/shared"))
    >>> str(layout.conf)
    '/tmp/sim/shared/slurm/slurm.conf'
    >>> nodes = [SlurmNode("node01", "127.0.1.1", 10001)]
    >>> text = slurm_conf(layout, "vm", 10000, nodes, cpus=2)
    >>> next(line for line in text.splitlines() if line.startswith("NodeName")).split()[1:5]
    ['NodeAddr=127.0.1.1', 'NodeHostname=node01', 'Port=10001', 'CPUs=2']
    >>> gres_conf(nodes)
    'AutoDetect=off\\nNodeName=node01 Name=gpu File=/dev/nvidia[0-7]\\n'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetclean.sim.layout import IN_NODE_DIR, PACKAGE_DIR

CLUSTER = "fleetclean-sim"
# Every node is in the default partition ``gpu``; the first node is also in ``debug``, so
# that inventories and limits built from partitions have two groups to tell apart.
PARTITIONS = ("gpu", "debug")
FIRST_PORT = 10000


@dataclass(frozen=True)
class SlurmNode:
    """One ``NodeName`` line: each ``slurmd`` listens on its own port, since all nodes share
    this machine's network namespace."""

    name: str
    address: str
    port: int


@dataclass(frozen=True)
class SlurmLayout:
    """Paths of the fleet's Slurm and munge below ``shared`` (the fleet's shared dir)."""

    shared: Path

    @property
    def dir(self) -> Path:
        return self.shared / "slurm"

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def gres(self) -> Path:
        return self.dir / "gres.conf"

    @property
    def ctld_state(self) -> Path:
        return self.dir / "ctld"

    @property
    def ctld_log(self) -> Path:
        return self.dir / "slurmctld.log"

    @property
    def munge_dir(self) -> Path:
        return self.shared / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_log(self) -> Path:
        return self.munge_dir / "munged.log"


def free_ports(count: int, listening: set[int], start: int = FIRST_PORT) -> list[int]:
    """The first ``count`` ports from ``start`` on that nobody listens on.

    >>> free_ports(3, {10001})
    [10000, 10002, 10003]
    """
    ports: list[int] = []
    port = start
    while len(ports) < count:
        if port > 32000:
            raise ValueError(f"no {count} free TCP ports between {start} and 32000")
        if port not in listening:
            ports.append(port)
        port += 1
    return ports


def listening_ports() -> set[int]:
    """TCP ports something listens on, any address (IPv4 and IPv6), from /proc/net."""
    ports: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def slurm_conf(
    layout: SlurmLayout,
    host: str,
    ctld_port: int,
    nodes: Sequence[SlurmNode],
    cpus: int,
    *,
    cgroup_mode: str = "none",
    epilog: str | None = None,
) -> str:
    """``slurm.conf`` for one controller on ``host`` and ``nodes``.

    proctrack/linuxproc: a job's orphans outlive it (as on many real clusters, and what
    fleetclean exists to clean up). Job steps go into cgroups as on a real node of the
    fleet's cgroup mode (see :func:`task_settings`). ``config_overrides``: the nodes share
    this machine's CPUs and memory, so the config, not the hardware, says what each node
    has. No accounting. ``epilog``: the ``Epilog=`` every slurmd runs as root after each
    job (a path every node sees).
    """
    lines = [
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        f"StateSaveLocation={layout.ctld_state}",
        f"SlurmctldPidFile={layout.dir / 'slurmctld.pid'}",
        f"SlurmctldLogFile={layout.ctld_log}",
        f"SlurmdSpoolDir={IN_NODE_DIR}/slurmd",
        f"SlurmdPidFile={IN_NODE_DIR}/slurmd.pid",
        f"SlurmdLogFile={IN_NODE_DIR}/slurmd.log",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        *task_settings(cgroup_mode),
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=30",
        "MailProg=/bin/true",
    ]
    if epilog:
        lines.append(f"Epilog={epilog}")
    for node in nodes:
        lines.append(
            f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name} "
            f"Port={node.port} CPUs={cpus} Gres=gpu:8 State=UNKNOWN"
        )
    names = ",".join(n.name for n in nodes)
    gpu, debug = PARTITIONS
    lines.append(f"PartitionName={gpu} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName={debug} Nodes={nodes[0].name} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


TASK_PROLOG = PACKAGE_DIR / "slurm_task_prolog.sh"


def task_settings(cgroup_mode: str) -> list[str]:
    """Where job steps' tasks go. On a cgroup-v1 node, Slurm's own cgroup/v1 plugin puts
    them in ``/slurm_NODE/uid_U/job_J/step_S/task_T`` (task/cgroup with ConstrainCores for
    cpuset, jobacct_gather/cgroup for memory and cpuacct; no memory limit: the nodes
    declare none). Slurm 22.05's cgroup/v2 plugin needs systemd and a machine with no v1
    hierarchy at all, so on a v2 node a TaskProlog places each task where it would, in
    ``system.slice/slurmstepd.scope/job_J/step_S/user/task_T``.

    >>> task_settings("v1")[:2]
    ['TaskPlugin=task/cgroup', 'JobAcctGatherType=jobacct_gather/cgroup']
    >>> task_settings("v2")[2].endswith("slurm_task_prolog.sh")
    True
    """
    if cgroup_mode == "v1":
        return ["TaskPlugin=task/cgroup", "JobAcctGatherType=jobacct_gather/cgroup"]
    lines = ["TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none"]
    if cgroup_mode == "v2":
        lines.append(f"TaskProlog={TASK_PROLOG}")
    return lines


def cgroup_conf(cgroup_mode: str) -> str:
    """``cgroup.conf``. Without the v1 plugin at work, it is pointed at an empty directory:
    slurmd always loads a cgroup plugin, and would otherwise refuse a node whose
    /sys/fs/cgroup is cgroup2 on a machine that also has v1 ("Hybrid mode is not
    supported"), or write into this machine's own hierarchies in a fleet without cgroups.

    >>> cgroup_conf("v1").splitlines()[:2]
    ['CgroupPlugin=cgroup/v1', 'CgroupAutomount=no']
    """
    lines = ["CgroupPlugin=cgroup/v1", "CgroupAutomount=no"]
    if cgroup_mode == "v1":
        lines += ["ConstrainCores=yes", "ConstrainRAMSpace=no", "ConstrainDevices=no"]
    else:
        lines.append(f"CgroupMountpoint={IN_NODE_DIR}/slurmd")
    return "\n".join(lines) + "\n"


def gres_conf(nodes: Sequence[SlurmNode]) -> str:
    """``gres.conf``: eight GPUs per node, backed by the node's fake /dev/nvidia0..7."""
    lines = ["AutoDetect=off"]
    lines += [f"NodeName={n.name} Name=gpu File=/dev/nvidia[0-7]" for n in nodes]
    return "\n".join(lines) + "\n"
