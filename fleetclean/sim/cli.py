"""``fleetclean sim up|status|spawn|fault|down``: the simulated fleet by hand.

The main CLI builds ``sim = sub.add_parser("sim")``, calls ``add_subparsers(sim)`` and
later ``run(args)``; SimError propagates to it, the one place that maps errors to exit
statuses. ``python -m fleetclean.sim.cli ...`` works on its own too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetclean.errors import SimError
from fleetclean.sim.accounts import DIRECTORY_USERS, USERS
from fleetclean.sim.faults import FAULTS, usage
from fleetclean.sim.launcher import gpu_list
from fleetclean.sim.layout import STATE_DIR_ENV

if TYPE_CHECKING:
    from fleetclean.sim.fleet import SimFleet

KINDS = (
    "sglang",
    "vllm",
    "trtllm",
    "triton",
    "tgi",
    "ray",
    "zombie-parent",
    "stubborn",
    "slow",
    "orphan",
    "stuck",
    "stuck-thread",
    "pthread-exit",
    "slow-exit",
    "monitor",
    "persistenced",
    "writer",
    "respawn",
    "holder",
)
# Run by a supervisor inside the node (sim/supervised.py): --run names the workload.
SUPERVISED = ("service", "container", "podman", "pod", "tmux", "screen", "slurm-job")
SPAWNABLE = KINDS + SUPERVISED
RAW = argparse.RawDescriptionHelpFormatter
SUDO_WORDS = {"nopasswd": "sudo NOPASSWD", "password": "sudo with password", "none": "no sudo"}


def _state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=f"the fleet's files and PIDs (default: ${STATE_DIR_ENV} or /tmp/fleetclean-sim)",
    )


def add_subparsers(sim_parser: argparse.ArgumentParser) -> None:
    """Add ``up``, ``status``, ``spawn``, ``fault`` and ``down`` under ``sim_parser``."""
    sub = sim_parser.add_subparsers(dest="sim_command", metavar="SIM_COMMAND", required=True)
    _add_up(sub)
    status = sub.add_parser(
        "status",
        help="list nodes, sshd, processes and GPU memory",
        formatter_class=RAW,
        epilog="example:\n  fleetclean sim status\n",
    )
    _state_dir(status)
    _add_spawn(sub)
    _add_fault(sub)
    down = sub.add_parser(
        "down",
        help="stop every process of the fleet (by PID) and remove its files",
        formatter_class=RAW,
        epilog="example:\n  fleetclean sim down\n",
    )
    _state_dir(down)


Subparsers = Any  # argparse's _SubParsersAction, private


def _add_up(sub: Subparsers) -> None:
    up = sub.add_parser(
        "up",
        help="start a simulated fleet (Linux, root)",
        formatter_class=RAW,
        description="Start N simulated 8-GPU nodes, each with its own sshd on 127.0.x.y.",
        epilog="examples:\n"
        "  fleetclean sim up --nodes 8\n"
        "  fleetclean sim up --nodes 4 --workload sglang --workload monitor\n"
        "  fleetclean sim up --nodes 257 --sshd-defaults\n",
    )
    up.add_argument("--nodes", type=int, default=8, metavar="N", help="how many (default 8)")
    up.add_argument(
        "--workload",
        action="append",
        default=[],
        choices=KINDS,
        metavar="KIND",
        help=f"spawn KIND on every node; repeatable ({', '.join(KINDS)})",
    )
    up.add_argument(
        "--subnet", type=int, default=0, metavar="S", help="addresses 127.S.x.y (default 0)"
    )
    up.add_argument(
        "--persistenced",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run nvidia-persistenced on every node, holding every GPU, as on a datacenter "
        "node (default on; --no-persistenced: none)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a real Slurm: munged, slurmctld here, a slurmd in every node",
    )
    up.add_argument(
        "--sshd-defaults",
        action="store_true",
        help="OpenSSH's own MaxStartups 10:30:100 and MaxSessions 10 on every sshd "
        "(default: lifted to 512, so that big runs measure fleetclean, not sshd's throttle)",
    )
    up.add_argument(
        "--host-ca",
        action="store_true",
        help="a site with an SSH certificate authority: every node's host key signed by "
        "the fleet's CA key (STATE/host_ca), its sshd showing that HostCertificate, and "
        "known_hosts one @cert-authority line instead of every node's key",
    )
    up.add_argument(
        "--cgroup",
        choices=("auto", "v2", "v1", "none"),
        default="auto",
        help="the nodes' cgroups: v2 alone, every v1 hierarchy (and cgroup2 where mounted), "
        "none; auto: v2 where this machine has it, else v1, else none (default)",
    )
    up.add_argument(
        "--epilog",
        type=Path,
        metavar="PATH",
        help="with --slurm: slurm.conf's Epilog=, a path under STATE/shared (which every "
        "node sees), e.g. epilog/fleetclean; write the script there (fleetclean export "
        "slurm-epilog ...)",
    )
    up.add_argument(
        "--gpu-minors",
        type=_minors,
        metavar="M,...",
        help="device minor of GPU 0,1,..7 (its /dev/nvidiaM), e.g. 1,0,3,2,5,4,7,6: a driver "
        "whose probe order differs from the bus order (default: each GPU's index)",
    )
    _state_dir(up)


def _add_spawn(sub: Subparsers) -> None:
    spawn = sub.add_parser(
        "spawn",
        help="start a workload inside a node",
        formatter_class=RAW,
        epilog="examples:\n"
        "  fleetclean sim spawn node01 sglang\n"
        "  fleetclean sim spawn node02 vllm --gpus 0-3 --mib 40960\n"
        "  fleetclean sim spawn all stubborn --gpu 5\n"
        "  fleetclean sim spawn node01 stuck --gpu 2     # state D once killed\n"
        "  fleetclean sim spawn node01 stuck-thread --gpu 3  # killed: a zombie, a thread in D\n"
        "  fleetclean sim spawn node01 pthread-exit --gpu 5  # alive: its main thread exited\n"
        "  fleetclean sim spawn node01 slow-exit --gpu 4 --delay 3\n"
        "  fleetclean sim spawn node01 writer --path /dev/shm/sglang_hs\n"
        "  fleetclean sim spawn node01 stubborn --gpu 2 --user ops\n"
        "under a supervisor (--run: the workload, holder by default):\n"
        "  fleetclean sim spawn node01 service --unit vllm --run vllm --gpus 0-7\n"
        "  fleetclean sim spawn node01 container --container sgl --run sglang --restart always\n"
        "  fleetclean sim spawn node01 container --container sgl --rootless alice --gpus 2\n"
        "  fleetclean sim spawn node01 podman --container sgl --restart always --gpus 3\n"
        "  fleetclean sim spawn node01 pod --pod llm-0 --namespace ml --gpus 3\n"
        "  fleetclean sim spawn node01 tmux --session train --gpus 4\n"
        "  fleetclean sim spawn node01 slurm-job --gpus 5   (a fleet with --slurm)\n",
    )
    spawn.add_argument("node", metavar="NODE", help="node name, or 'all'")
    spawn.add_argument("kind", choices=SPAWNABLE, metavar="KIND", help=", ".join(SPAWNABLE))
    spawn.add_argument(
        "--gpu",
        type=int,
        help="GPU index (stubborn, slow, orphan, stuck, stuck-thread, pthread-exit, slow-exit, "
        "respawn)",
    )
    spawn.add_argument("--gpus", help="GPU set for sglang and the engines, e.g. 0-7 or 0,2,4")
    spawn.add_argument("--mib", type=int, help="GPU memory per process, MiB")
    spawn.add_argument(
        "--delay", type=float,
        help="seconds from SIGTERM to exit (slow), in the exit (slow-exit); respawn: its worker's",
    )
    spawn.add_argument("--name", help="command line to show instead of the default")
    spawn.add_argument("--path", help="directory to write into (writer)")
    spawn.add_argument("--user", choices=[u.name for u in (*USERS, *DIRECTORY_USERS)],
                       help="run it as this account of the node (default root): a login "
                       "account, or carol, whom the node knows only from its directory "
                       "service (NSS), not /etc/passwd")
    spawn.add_argument(
        "--sees", choices=("own", "all"),
        help="holder: open every GPU's device file, with memory on its own GPUs only (all), "
        "as CUDA does where no CUDA_VISIBLE_DEVICES or device cgroup narrows it; "
        "default own",
    )
    spawn.add_argument(
        "--devices",
        choices=("ctl", "all"),
        help="persistenced: hold every GPU too (default) or /dev/nvidiactl only",
    )
    spawn.add_argument(
        "--thread", choices=("work", "driver"),
        help="pthread-exit: the thread left once its main thread ended works on (default), "
        "or waits in the node's stuck driver (state D: killed, it is stuck)",
    )
    _supervisor_options(spawn)
    _state_dir(spawn)


def _add_fault(sub: Subparsers) -> None:
    fault = sub.add_parser(
        "fault",
        help="make a node's GPUs, nvidia-smi, kernel log, driver or sshd misbehave",
        formatter_class=RAW,
        epilog="faults:\n" + "".join(f"  {usage(f)}\n" for f in FAULTS) + "examples:\n"
        "  fleetclean sim fault node03 lost 5\n"
        "  fleetclean sim fault node03 leak 5 512\n"
        "  fleetclean sim fault node03 slow-auth 3\n"
        "  fleetclean sim fault node02 requiretty\n"
        "  fleetclean sim fault node03 none\n",
    )
    fault.add_argument("node", metavar="NODE", help="node name, or 'all'")
    fault.add_argument("fault", choices=FAULTS, metavar="FAULT", help="see below")
    fault.add_argument("args", nargs="*", metavar="ARG", help="the fault's arguments")
    _state_dir(fault)


SUPERVISOR_OPTIONS = (
    ("run", "KIND", "the workload a supervisor runs (default holder)"),
    ("unit", "NAME", "service: the unit's name"),
    ("restart", "POLICY", "service: Restart= (always); container, podman: --restart (no)"),
    ("uid", "UID", "service: a user service of UID (under user@UID.service)"),
    ("container", "NAME", "container, podman: its name; pod: the container's name"),
    ("image", "IMAGE", "container, podman, pod: the image shown"),
    ("rootless", "USER", "container: run it by USER's own rootless docker daemon "
     "(unix:///run/user/UID/docker.sock), started if need be; root's knows nothing of it; "
     "podman: run by USER's own podman (its store in /run/user/UID)"),
    ("pod", "NAME", "pod: its name"),
    ("namespace", "NS", "pod: its namespace (default)"),
    ("qos", "CLASS", "pod: besteffort, burstable or guaranteed"),
    ("driver", "DRIVER", "container, pod: systemd or cgroupfs (default by cgroup mode); "
     "podman: its cgroup manager, systemd or cgroupfs (systemd)"),
    ("session", "NAME", "tmux, screen: the session's name (train)"),
)


def _supervisor_options(spawn: argparse.ArgumentParser) -> None:
    group = spawn.add_argument_group("supervisors (service, container, podman, pod, tmux, "
                                     "screen, slurm-job)")
    for name, metavar, text in SUPERVISOR_OPTIONS:
        kind: Any = int if name == "uid" else str
        group.add_argument(f"--{name}", type=kind, metavar=metavar, help=text)


def run(args: argparse.Namespace) -> int:
    """Carry out the parsed ``sim`` command; 0 on success. Raises SimError."""
    command = args.sim_command
    if command == "up":
        return _up(args)
    if command == "down":
        _down(args.state_dir)
        return 0
    from fleetclean.sim.fleet import SimFleet

    fleet = SimFleet.load(args.state_dir)
    if command == "status":
        _status(fleet)
    elif command == "spawn":
        opts = _spawn_opts(args)
        for name in _targets(fleet, args.node):
            started = fleet.spawn(name, args.kind, **opts)
            print(f"{name}: {args.kind} pids {' '.join(map(str, started))}")
    elif command == "fault":
        for name in _targets(fleet, args.node):
            fleet.set_fault(name, args.fault, *args.args)
            print(f"{name}: fault {' '.join([args.fault, *args.args])}")
    return 0


def _minors(text: str) -> list[int]:
    words = [w.strip() for w in text.split(",")]
    if not all(w.isdigit() for w in words):
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}")
    return [int(w) for w in words]


def _up(args: argparse.Namespace) -> int:
    from fleetclean.sim.fleet import SimFleet

    fleet = SimFleet.up(args.nodes, args.state_dir, subnet=args.subnet,
                        persistenced=args.persistenced, slurm=args.slurm,
                        sshd_defaults=args.sshd_defaults, cgroup=args.cgroup,
                        gpu_minors=args.gpu_minors, slurm_epilog=args.epilog,
                        host_ca=args.host_ca)
    for kind in args.workload:
        for sim_node in fleet.nodes:
            fleet.spawn(sim_node, kind)
    first = fleet.nodes[0].name
    print(f"{len(fleet.nodes)} simulated nodes up in {fleet.state_dir}")
    print(f"  cgroups:    {fleet.cgroup_description}")
    print(f"  inventory:  {fleet.inventory_path}")
    print(f"  ssh config: {fleet.ssh_config_path}")
    logins = ", ".join(f"{u.name} ({SUDO_WORDS[u.sudo]})" for u in fleet.users)
    print(f"  accounts:   root, {logins}; their password: {fleet.layout.sudo_password}")
    conf = fleet.slurm_conf_path
    if conf is not None:
        print(f"  slurm:      export SLURM_CONF={conf}")
    print("try:")
    print(f"  ssh -F {fleet.ssh_config_path} {first} nvidia-smi")
    print(f"  fleetclean status -i {fleet.inventory_path}")
    print(f"  fleetclean sim spawn {first} sglang")
    print(f"  fleetclean run post-extraction -i {fleet.inventory_path}")
    if conf is not None:
        print(f"  SLURM_CONF={conf} srun -w {first} --gres=gpu:1 nvidia-smi")
    state = f" --state-dir {fleet.state_dir}" if args.state_dir else ""
    print(f"stop it with: fleetclean sim down{state}")
    return 0


def _down(state_dir: Path | None) -> None:
    from fleetclean.sim.fleet import SimFleet

    root = SimFleet.down_dir(state_dir)
    print(f"simulated fleet in {root} is down")


def busy_nodes(names: list[str], fraction: float) -> list[str]:
    """``fraction`` of ``names``, spread evenly, the first node first (benchmarks' busy
    nodes).

    >>> busy_nodes([f"n{i}" for i in range(1, 21)], 0.1)
    ['n1', 'n11']
    >>> busy_nodes(["a", "b"], 0.0)
    []
    """
    count = round(len(names) * fraction)
    return [names[i * len(names) // count] for i in range(count)] if count else []


def _targets(fleet: SimFleet, node: str) -> list[str]:
    if node == "all":
        return [n.name for n in fleet.nodes]
    return [fleet.node(node).name]


def _spawn_opts(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    keys = ("gpu", "mib", "delay", "name", "path", "devices", "user", "sees", "thread")
    for key in keys + tuple(name for name, _, _ in SUPERVISOR_OPTIONS):
        value = getattr(args, key)
        if value is not None:
            opts[key] = value
    if args.gpus is not None:
        try:
            opts["gpus"] = gpu_list(args.gpus)
        except ValueError as exc:
            raise SimError(f"bad --gpus {args.gpus!r}", hint="e.g. 0-7 or 0,2,4") from exc
    return opts


def _status(fleet: SimFleet) -> None:
    conf = fleet.slurm_conf_path
    if conf is not None:
        print(f"SLURM_CONF={conf}")
    print(f"cgroups: {fleet.cgroup_description}")
    rows = [("NODE", "ADDRESS", "SSHD", "PROCS", "GPU MiB USED (0..7)")]
    for sim_node in fleet.nodes:
        mode = fleet.listener_mode(sim_node)
        if mode == "stopped":
            rows.append((sim_node.name, sim_node.address, "stopped", "-", "-"))
            continue
        used = fleet.gpu_used_mib(sim_node)
        gpus = " ".join(str(v) for v in used) if used else "(nvidia-smi failed)"
        procs = str(len(fleet.processes(sim_node)))
        sshd = {"sshd": "up", "off": "down"}.get(mode, mode)
        rows.append((sim_node.name, sim_node.address, sshd, procs, gpus))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)), row[4])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetclean.sim.cli")
    add_subparsers(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SimError as exc:
        print(f"fleetclean sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
