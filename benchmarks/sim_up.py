"""How long ``SimFleet.up`` takes and what an idle simulated node costs.

Run as root on Linux: ``.venv/bin/python benchmarks/sim_up.py [--runs 3] [--sizes 8 64]
[--cgroups none v2 v1] [--busy 0.1] [--against /path/to/other/checkout] [--no-supervisors]``.
Prints, per cgroup mode and fleet size, the median wall time of ``up`` (every sshd
listening), of ``down``, and the memory of one node (PSS of every process of the fleet,
summed and divided by the node count), plus the time of one fake ``nvidia-smi`` query;
``up`` and ``down`` also as a ratio to the first mode (the baseline, run in the same
invocation). ``--busy F``: after ``up``, a fraction F of the nodes each run an SGLang tp8
server (``spawn sglang``: a server, eight workers, a detokenizer), timed apart ("busy s"),
and "avail GiB" is how much MemAvailable fell from before ``up`` to then, the whole
fleet's cost as the machine sees it. ``--against DIR``: the same rows, same invocation,
with the simulator of another checkout (its ``fleetclean`` package imported instead of
this one's), then the ratios. Then, on one node, what starting each supervisor costs: the
first workload of each kind (which starts the service manager, dockerd, the kubelet)
against the second, and the PSS the supervisors add.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def one_run(size: int, root: Path, mode: str, busy: float = 0.0,
            subnet: int = SUBNET) -> tuple[float, ...]:
    """(up s, CPU ms/node, down s, PSS MiB/node, RSS MiB/node, nvidia-smi ms, busy s,
    MemAvailable drop GiB) for one fleet. CPU: what ``up`` cost this process, its children
    (the zygote, ssh-keygen, unshare) and the nodes' processes, per node; unlike wall time
    it hardly moves with the machine's load."""
    avail = mem_available_kib()
    before = os.times()
    started = time.perf_counter()
    fleet = SimFleet.up(size, root / f"fleet{size}", subnet=subnet, cgroup=mode)
    up_s = time.perf_counter() - started
    after = os.times()
    busy_s = 0.0
    try:
        # CPU of up alone: the workloads started below are not part of it.
        up_cpu = {p.host_pid: cpu_ms(p.host_pid)
                  for n in fleet.nodes for p in fleet.processes(n, include_system=True)}
        count = round(size * busy)
        if count:
            started = time.perf_counter()
            fleet.spawn_all(fleet.nodes[:count], "sglang")
            busy_s = time.perf_counter() - started
        dropped = (avail - mem_available_kib()) / 1024 / 1024
        procs = [p for n in fleet.nodes for p in fleet.processes(n, include_system=True)]
        ours = sum(after[:4]) - sum(before[:4])
        cpu = (ours * 1000 + sum(up_cpu.values())) / size
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
    return up_s, cpu, down_s, pss, rss, statistics.median(smi), busy_s, dropped


def supervisors(root: Path, mode: str, subnet: int = SUBNET) -> None:
    """First and second workload of each supervised kind on one node: the first pays for
    starting its supervisor; the supervisors' PSS is what a node with them costs more."""
    fleet = SimFleet.up(1, root / "sup", subnet=subnet, cgroup=mode)
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


HEADER = (f"{'code':>6}  {'cgroup':>6}  {'nodes':>5}  {'up s':>6}  {'x':>5}  "
          f"{'CPU ms/node':>11}  {'x':>5}  {'down s':>6}  {'PSS MiB/node':>12}  "
          f"{'RSS MiB/node':>12}  {'nvidia-smi ms':>13}  {'busy s':>6}  {'avail GiB':>9}")


def rows(args: argparse.Namespace) -> list[dict[str, object]]:
    """One row per cgroup mode and size: the medians of ``--runs`` fleets."""
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="fleetclean-bench-") as tmp:
        for mode in args.cgroups:
            for size in args.sizes:
                runs = [one_run(size, Path(tmp), mode, args.busy, args.subnet)
                        for _ in range(args.runs)]
                medians = [statistics.median(c) for c in zip(*runs, strict=True)]
                keys = ("up", "cpu", "down", "pss", "rss", "smi", "busy", "avail")
                out.append({"mode": mode, "size": size, **dict(zip(keys, medians, strict=True))})
    return out


def print_rows(label: str, found: list[dict[str, object]],
               baseline: dict[int, tuple[float, float]]) -> None:
    for r in found:
        size, up, cpu = int(str(r["size"])), float(str(r["up"])), float(str(r["cpu"]))
        base_up, base_cpu = baseline.setdefault(size, (up, cpu))
        print(f"{label:>6}  {r['mode']:>6}  {size:>5}  {up:>6.2f}  {up / base_up:>5.2f}  "
              f"{cpu:>11.1f}  {cpu / base_cpu:>5.2f}  {r['down']:>6.2f}  {r['pss']:>12.1f}  "
              f"{r['rss']:>12.1f}  {r['smi']:>13.1f}  {r['busy']:>6.2f}  {r['avail']:>9.2f}",
              flush=True)


# Run this script with another checkout's fleetclean: its directory first on sys.path, and
# the editable install's finder (which would find this checkout's) out of the way.
BOOT = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path.insert(0, sys.argv[1])
script = sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def against(checkout: str, args: argparse.Namespace) -> list[dict[str, object]]:
    """The rows measured with ``checkout``'s simulator, in a child interpreter."""
    argv = [sys.executable, "-c", BOOT, checkout, os.path.abspath(__file__), "--json",
            "--runs", str(args.runs), "--busy", str(args.busy), "--subnet", str(args.subnet),
            "--sizes",
            *map(str, args.sizes), "--cgroups", *args.cgroups]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    found: list[dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--cgroups", nargs="+", default=["none", "auto"],
                        choices=("none", "auto", "v2", "v1"))
    parser.add_argument("--busy", type=float, default=0.0,
                        help="fraction of the nodes that run an SGLang tp8 server")
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="first measure the simulator of this checkout (the baseline)")
    parser.add_argument("--no-supervisors", action="store_true")
    parser.add_argument("--subnet", type=int, default=SUBNET,
                        help=f"second octet of the fleets' addresses (default {SUBNET})")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(rows(args)))
        return 0
    print(HEADER)
    baseline: dict[int, tuple[float, float]] = {}
    if args.against:
        print_rows("other", against(args.against, args), baseline)
    print_rows("this", rows(args), baseline)
    if not args.no_supervisors:
        with tempfile.TemporaryDirectory(prefix="fleetclean-bench-") as tmp:
            supervisors(Path(tmp), args.cgroups[-1], args.subnet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
