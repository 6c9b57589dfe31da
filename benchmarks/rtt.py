"""What a laptop's distance to its fleet costs a host: round trips, against OpenSSH's.

Run as root on Linux: ``.venv/bin/python benchmarks/rtt.py [--rtt 0.1] [--reps 7]
[--against CHECKOUT]``. One simulated node behind the simulator's latency proxy
(``sim fault NODE latency SECONDS``: every SSH byte SECONDS/2 late each way), first at a
round trip of 0 (the proxy alone) and then at ``--rtt``, each in alternating repetitions
of:

- ``fleetclean status --json`` on the node (and, with ``--against``, another checkout's,
  run by its own ``.venv``: a before/after in one invocation);
- ``ssh`` (OpenSSH, curve25519, the node's ssh_config) running
  ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader``: what pdsh runs on
  each host.

Prints the median wall of each at both delays and the round trips a host costs each tool,
(median at ``--rtt`` minus median at 0) / ``--rtt``. The TCP handshake is the kernel's on
loopback and is not delayed: a real network adds one more round trip to every tool. From
a laptop, a fleet of N hosts at ``--forks`` F takes about N / F times a host's round
trips, whatever the fleet's own speed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scale import free_subnet

from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
QUERY = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader"


def timed(argv: list[str]) -> float:
    """The wall of one run, which must succeed: the node is clean, so anything but exit 0
    (a timeout, a misread) is no sample."""
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]}: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt", type=float, default=0.1, help="round trip, seconds")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--against", type=Path, metavar="CHECKOUT")
    args = ap.parse_args()
    if not args.rtt > 0:
        ap.error("--rtt must be above 0 (the baseline is 0)")
    with tempfile.TemporaryDirectory(prefix="fleetclean-rtt-") as tmp, \
            SimFleet.up(1, Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
        where = ["-i", str(fleet.inventory_path), "-F", str(fleet.ssh_config_path), "--json"]
        tools = {"fleetclean": [str(ROOT / ".venv" / "bin" / "fleetclean"), "status", *where]}
        if args.against:
            tools[f"fleetclean ({args.against.name})"] = [
                str(args.against / ".venv" / "bin" / "fleetclean"), "status", *where]
        tools["ssh (OpenSSH)"] = ["ssh", "-F", str(fleet.ssh_config_path), "-o",
                                  "KexAlgorithms=curve25519-sha256", "node01", QUERY]
        walls: dict[tuple[str, float], list[float]] = {}
        for rtt in (0.0, args.rtt):
            fleet.set_fault("node01", "latency", rtt)
            for argv in tools.values():  # one unmeasured run each: caches, first imports
                timed(argv)
            for _ in range(args.reps):
                for name, argv in tools.items():
                    walls.setdefault((name, rtt), []).append(timed(argv))
        print(f"one node, {args.reps} alternating repetitions, round trip {args.rtt:g} s "
              "(TCP's handshake not delayed)")
        print(f"{'tool':<28} {'wall at 0':>10} {'wall at rtt':>12} {'round trips':>12}")
        for name in tools:
            at0 = statistics.median(walls[(name, 0.0)])
            at = statistics.median(walls[(name, args.rtt)])
            print(f"{name:<28} {at0:>9.3f}s {at:>11.3f}s {(at - at0) / args.rtt:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
