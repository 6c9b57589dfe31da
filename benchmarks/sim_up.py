"""How long ``SimFleet.up`` takes and what an idle simulated node costs.

Run as root on Linux: ``.venv/bin/python benchmarks/sim_up.py [--runs 3] [--sizes 8 64]
[--cgroups none v2 v1]``. Prints, per cgroup mode and fleet size, the median wall time of
``up`` (every sshd listening), of ``down``, and the memory of one idle node (PSS of its init
and sshd, summed over the fleet and divided by the node count), plus the time of one fake
``nvidia-smi`` query; ``up`` and ``down`` also as a ratio to the first mode (the baseline, run
in the same invocation). Then, on one node, what starting each supervisor costs: the first
workload of each kind (which starts the service manager, dockerd, the kubelet) against the
second, and the PSS the supervisors add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from fleetclean.sim import SimFleet, pids

TICK = os.sysconf("SC_CLK_TCK")

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


def cpu_ms(host_pid: int) -> float:
    fields = pids.stat_fields(host_pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) * 1000 / TICK


def one_run(size: int, root: Path, mode: str) -> tuple[float, ...]:
    """(up s, CPU ms/node, down s, PSS MiB/node, RSS MiB/node, nvidia-smi ms) for one
    fleet. CPU: what ``up`` cost this process, its children (ssh-keygen, unshare) and the
    nodes' processes, per node; unlike wall time it hardly moves with the machine's load."""
    before = os.times()
    started = time.perf_counter()
    fleet = SimFleet.up(size, root / f"fleet{size}", subnet=SUBNET, cgroup=mode)
    up_s = time.perf_counter() - started
    after = os.times()
    try:
        procs = [p for n in fleet.nodes for p in fleet.processes(n, include_system=True)]
        ours = sum(after[:4]) - sum(before[:4])
        cpu = (ours * 1000 + sum(cpu_ms(p.host_pid) for p in procs)) / size
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
    return up_s, cpu, down_s, pss, rss, statistics.median(smi)


def supervisors(root: Path, mode: str) -> None:
    """First and second workload of each supervised kind on one node: the first pays for
    starting its supervisor; the supervisors' PSS is what a node with them costs more."""
    fleet = SimFleet.up(1, root / "sup", subnet=SUBNET, cgroup=mode)
    try:
        base = {p.pid for p in fleet.processes("node01", include_system=True)}
        print(f"{'kind':>9}  {'first s':>7}  {'second s':>8}")
        for gpu, kind in enumerate(("service", "container", "pod")):
            times = []
            for n in range(2):
                started = time.perf_counter()
                fleet.spawn("node01", kind, gpus=str(gpu), unit=f"u{n}", container=f"c{n}",
                            pod=f"p{n}")
                times.append(time.perf_counter() - started)
            print(f"{kind:>9}  {times[0]:>7.2f}  {times[1]:>8.2f}")
        daemons = [p for p in fleet.processes("node01", include_system=True)
                   if p.pid not in base and p.cmdline.split()[0] in
                   ("/lib/systemd/systemd", "/usr/bin/dockerd", "/usr/bin/kubelet")]
        pss = sum(pss_kib(p.host_pid) for p in daemons) / 1024
        print(f"supervisors (systemd, dockerd, kubelet): {pss:.1f} MiB PSS")
    finally:
        fleet.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--cgroups", nargs="+", default=["none", "auto"],
                        choices=("none", "auto", "v2", "v1"))
    args = parser.parse_args()
    print(
        f"{'cgroup':>6}  {'nodes':>5}  {'up s':>6}  {'x':>5}  {'CPU ms/node':>11}  {'x':>5}  "
        f"{'down s':>6}  {'PSS MiB/node':>12}  {'RSS MiB/node':>12}  {'nvidia-smi ms':>13}"
    )
    baseline: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="fleetclean-bench-") as tmp:
        for mode in args.cgroups:
            for size in args.sizes:
                runs = [one_run(size, Path(tmp), mode) for _ in range(args.runs)]
                up, cpu, down, pss, rss, smi = (statistics.median(c)
                                                for c in zip(*runs, strict=True))
                base_up, base_cpu = baseline.setdefault(size, (up, cpu))
                print(f"{mode:>6}  {size:>5}  {up:>6.2f}  {up / base_up:>5.2f}  {cpu:>11.1f}  "
                      f"{cpu / base_cpu:>5.2f}  {down:>6.2f}  {pss:>12.1f}  {rss:>12.1f}  "
                      f"{smi:>13.1f}")
        supervisors(Path(tmp), args.cgroups[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
