"""How long ``SimFleet.up`` takes and what an idle simulated node costs.

Run as root on Linux: ``.venv/bin/python benchmarks/sim_up.py [--runs 3] [--sizes 8 64]``.
Prints, per fleet size, the median wall time of ``up`` (every sshd listening), of
``down``, and the memory of one idle node (PSS of its init and sshd, summed over the
fleet and divided by the node count), plus the time of one fake ``nvidia-smi`` query.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from fleetclean.sim import SimFleet

SUBNET = 90  # away from the default fleet (0) and from test fleets (100..249)


def pss_kib(host_pid: int) -> int:
    """Proportional set size: shared pages (python, sshd text) counted once overall."""
    try:
        for line in Path(f"/proc/{host_pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kib(host_pid: int) -> int:
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_run(size: int, root: Path) -> tuple[float, float, float, float, float]:
    """(up s, down s, PSS MiB/node, RSS MiB/node, nvidia-smi ms) for one fleet."""
    started = time.perf_counter()
    fleet = SimFleet.up(size, root / f"fleet{size}", subnet=SUBNET)
    up_s = time.perf_counter() - started
    try:
        procs = [p for n in fleet.nodes for p in fleet.processes(n, include_system=True)]
        pss = sum(pss_kib(p.host_pid) for p in procs) / 1024 / size
        rss = sum(rss_kib(p.host_pid) for p in procs) / 1024 / size
        query = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]
        fleet.run_in("node01", ["true"])
        smi = []
        for _ in range(10):
            # Timed inside the node so that nsenter's own start-up is not counted.
            done = fleet.run_in(
                "node01",
                [
                    "sh",
                    "-c",
                    f"s=$(date +%s%N); {' '.join(query)} >/dev/null; echo $(( $(date +%s%N) - s ))",
                ],
            )
            smi.append(int(done.stdout) / 1e6)
    finally:
        started = time.perf_counter()
        fleet.down()
        down_s = time.perf_counter() - started
    return up_s, down_s, pss, rss, statistics.median(smi)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    args = parser.parse_args()
    print(
        f"{'nodes':>5}  {'up s':>6}  {'down s':>6}  {'PSS MiB/node':>12}  "
        f"{'RSS MiB/node':>12}  {'nvidia-smi ms':>13}"
    )
    with tempfile.TemporaryDirectory(prefix="fleetclean-bench-") as tmp:
        for size in args.sizes:
            runs = [one_run(size, Path(tmp)) for _ in range(args.runs)]
            up, down, pss, rss, smi = (statistics.median(col) for col in zip(*runs, strict=True))
            print(f"{size:>5}  {up:>6.2f}  {down:>6.2f}  {pss:>12.1f}  {rss:>12.1f}  {smi:>13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
