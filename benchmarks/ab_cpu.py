"""Controller CPU per host of two fleetclean checkouts, A/B in one invocation.

Run: ``.venv/bin/python benchmarks/ab_cpu.py INVENTORY --base TREE --new TREE [--reps 5]
[--forks 64]``, each TREE a checkout with its own ``.venv`` (``bash scripts/dev setup``), the
inventory a simulated fleet's (``fleetclean sim up --nodes 64 ...``). Per repetition,
``status`` and then ``run post-extraction --no-record`` on every host of the inventory,
once with each tree, the order alternating between repetitions so that a drift in the
machine's load hits both alike. The CPU is user+sys of the fleetclean process and its
threads from ``os.wait4`` (the simulated nodes' CPU is not in it), divided by the hosts;
printed min/median/max with the load average before and after. Also the machine's busy
time while each ran (``/proc/stat``): the whole bill, the simulated nodes' sshd and script
included, which is where a change to the scripts shows.

``--busy F``: the inventory is a simulated fleet's own (``STATE/inventory.yaml``), and an
SGLang tp8 server is started on that fraction of its nodes before every post-extraction
(which stops them) and before each repetition's status runs: every run of either tree finds
the same busy fleet (at 1,000 nodes: ``fleetclean sim up --nodes 1000 --state-dir STATE``,
then ``--busy 0.1``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from peers import machine_cpu

COMMANDS = {"status": ["status"], "post-extraction": ["run", "post-extraction", "--no-record"]}


def hosts_in(inventory: Path) -> int:
    from fleetclean.inventory import load_inventory

    return len(load_inventory(inventory).select(None))


def one(tree: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, the machine's busy seconds) of one run; a run that fails
    is said and still counted."""
    busy = machine_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen([str(tree / ".venv" / "bin" / "fleetclean"), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):  # 1: some host dirty, which a status of a busy fleet is
        print(f"  note: {tree.name} {argv[0]}: exit {code}: {err[-300:]}", flush=True)
    return (usage.ru_utime + usage.ru_stime, time.perf_counter() - started,
            machine_cpu() - busy)


def busy_refill(inventory: Path, busy: float) -> Callable[[], None]:
    """What makes ``busy`` of the fleet's nodes busy again (nothing for 0)."""
    if not busy:
        return lambda: None
    from fleetclean.sim import SimFleet
    from fleetclean.sim.cli import busy_nodes

    fleet = SimFleet.load(inventory.parent)
    names = busy_nodes([node.name for node in fleet.nodes], busy)

    def refill() -> None:
        idle = [name for name in names
                if not any("sglang" in p.cmdline for p in fleet.processes(name))]
        fleet.spawn_all(idle, "sglang")

    return refill


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inventory", type=Path)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--forks", type=int, default=64)
    ap.add_argument("--busy", type=float, default=0.0, metavar="F")
    args = ap.parse_args()
    n = hosts_in(args.inventory)
    refill = busy_refill(args.inventory, args.busy)
    trees = {"base": args.base, "new": args.new}
    home = tempfile.mkdtemp(prefix="fleetclean-ab-")
    env = dict(os.environ, NO_COLOR="1", HOME=home, FLEETCLEAN_STATE_DIR=f"{home}/state")
    cpu: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    wall: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    bill: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    print(f"{n} hosts, --forks {args.forks}, load {os.getloadavg()}", flush=True)
    for rep in range(args.reps):
        order = list(trees) if rep % 2 == 0 else list(trees)[::-1]
        refill()
        for command, argv in COMMANDS.items():
            for tree in order:
                if command != "status":
                    refill()
                used, took, whole = one(trees[tree], [*argv, "-i", str(args.inventory),
                                                      "-f", str(args.forks)], env)
                cpu[(tree, command)].append(used * 1000 / n)
                wall[(tree, command)].append(took)
                bill[(tree, command)].append(whole * 1000 / n)
    print(f"load after {os.getloadavg()}")
    for command in COMMANDS:
        for tree in trees:
            xs = cpu[(tree, command)]
            print(f"{command:16} {tree:5} CPU ms/host {statistics.median(xs):.2f} "
                  f"({min(xs):.2f}-{max(xs):.2f}), wall "
                  f"{statistics.median(wall[(tree, command)]):.2f} s, machine CPU ms/host "
                  f"{statistics.median(bill[(tree, command)]):.1f}; "
                  f"runs {' '.join(f'{x:.1f}' for x in xs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
