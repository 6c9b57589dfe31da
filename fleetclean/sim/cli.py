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
    "monitor",
    "persistenced",
    "writer",
    "respawn",
)
RAW = argparse.RawDescriptionHelpFormatter


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

    up = sub.add_parser(
        "up",
        help="start a simulated fleet (Linux, root)",
        formatter_class=RAW,
        description="Start N simulated 8-GPU nodes, each with its own sshd on 127.0.x.y.",
        epilog="examples:\n"
        "  fleetclean sim up --nodes 8\n"
        "  fleetclean sim up --nodes 4 --workload sglang --workload monitor\n",
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
        action="store_true",
        help="run nvidia-persistenced on every node, holding every GPU (default off)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a real Slurm: munged, slurmctld here, a slurmd in every node",
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

    status = sub.add_parser(
        "status",
        help="list nodes, sshd, processes and GPU memory",
        formatter_class=RAW,
        epilog="example:\n  fleetclean sim status\n",
    )
    _state_dir(status)

    spawn = sub.add_parser(
        "spawn",
        help="start a workload inside a node",
        formatter_class=RAW,
        epilog="examples:\n"
        "  fleetclean sim spawn node01 sglang\n"
        "  fleetclean sim spawn node02 sglang --gpus 0-3 --mib 40960\n"
        "  fleetclean sim spawn all stubborn --gpu 5\n"
        "  fleetclean sim spawn node01 writer --path /dev/shm/sglang_hs\n",
    )
    spawn.add_argument("node", metavar="NODE", help="node name, or 'all'")
    spawn.add_argument("kind", choices=KINDS, metavar="KIND", help=", ".join(KINDS))
    spawn.add_argument("--gpu", type=int, help="GPU index (stubborn, slow, orphan, respawn)")
    spawn.add_argument("--gpus", help="GPU set for sglang and the engines, e.g. 0-7 or 0,2,4")
    spawn.add_argument("--mib", type=int, help="GPU memory per process, MiB")
    spawn.add_argument("--delay", type=float, help="seconds from SIGTERM to exit (slow)")
    spawn.add_argument("--name", help="command line to show instead of the default")
    spawn.add_argument("--path", help="directory to write into (writer)")
    spawn.add_argument(
        "--devices",
        choices=("ctl", "all"),
        help="persistenced: hold /dev/nvidiactl only (default, for now) or every GPU too",
    )
    _state_dir(spawn)

    fault = sub.add_parser(
        "fault",
        help="make a node's GPUs, nvidia-smi, kernel log or sshd misbehave",
        formatter_class=RAW,
        epilog="faults:\n" + "".join(f"  {usage(f)}\n" for f in FAULTS) + "examples:\n"
        "  fleetclean sim fault node03 lost 5\n"
        "  fleetclean sim fault node03 leak 5 512\n"
        "  fleetclean sim fault node03 slow-auth 3\n"
        "  fleetclean sim fault node03 none\n",
    )
    fault.add_argument("node", metavar="NODE", help="node name, or 'all'")
    fault.add_argument("fault", choices=FAULTS, metavar="FAULT", help="see below")
    fault.add_argument("args", nargs="*", metavar="ARG", help="the fault's arguments")
    _state_dir(fault)

    down = sub.add_parser(
        "down",
        help="stop every process of the fleet (by PID) and remove its files",
        formatter_class=RAW,
        epilog="example:\n  fleetclean sim down\n",
    )
    _state_dir(down)


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
                        gpu_minors=args.gpu_minors, slurm_epilog=args.epilog)
    for kind in args.workload:
        for sim_node in fleet.nodes:
            fleet.spawn(sim_node, kind)
    first = fleet.nodes[0].name
    print(f"{len(fleet.nodes)} simulated nodes up in {fleet.state_dir}")
    print(f"  inventory:  {fleet.inventory_path}")
    print(f"  ssh config: {fleet.ssh_config_path}")
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


def _targets(fleet: SimFleet, node: str) -> list[str]:
    if node == "all":
        return [n.name for n in fleet.nodes]
    return [fleet.node(node).name]


def _spawn_opts(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for key in ("gpu", "mib", "delay", "name", "path", "devices"):
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
