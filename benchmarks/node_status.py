"""What the status script costs on a busy 8-GPU node, against one bare nvidia-smi query.

Run as root on Linux: ``.venv/bin/python benchmarks/node_status.py [--rounds 5] [--n 20]``.
Starts a one-node simulated fleet (nvidia-persistenced on every GPU, as by default), renders
``status`` for it, and inside the node times, in alternating rounds of ``--n`` calls each,
(a) ``bash -s`` running the rendered script and (b) ``nvidia-smi
--query-gpu=index,uuid,name,memory.used,memory.total --format=csv,noheader,nounits``: first
on the idle node, then with an SGLang tp8 workload (every GPU busy: the script also reads
the compute apps, in parallel, and names eight processes). Wall and CPU (user+sys of the
process and its children, bash's ``times``) are per call; the ratios are same-run:
min/median/max over the rounds, and the best status over the best bare query (the figure
least moved by other load on the machine). The fake nvidia-smi is a Python script (tens of
ms of CPU, where a real one waits on the driver), so absolute numbers are the fake's; the
ratio is what #18 bounds (<= 1.2x on a busy node).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fleetclean.sim import SimFleet

SUBNET = 91
BARE = ("nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total "
        "--format=csv,noheader,nounits")
# Wall time and the CPU of every child, from bash itself (no /usr/bin/time in a node).
TIMER = r"""
n=$1; shift
t0=$EPOCHREALTIME
for ((i = 0; i < n; i++)); do eval "$*" >/dev/null 2>&1; done
t1=$EPOCHREALTIME
echo "$t0 $t1"
times
"""


def _cpu_seconds(field: str) -> float:
    minutes, seconds = field.rstrip("s").split("m")
    return int(minutes) * 60 + float(seconds)


def measure(fleet: SimFleet, n: int, command: str) -> tuple[float, float]:
    """(wall, cpu) seconds per call of ``command`` inside node01."""
    done = fleet.run_in("node01", ["bash", "-c", TIMER, "timer", str(n), command])
    # `times` prints the shell's own CPU, then its children's: the calls are children.
    lines = done.stdout.splitlines()
    t0, t1 = lines[0].split()
    user, sys_ = lines[-1].split()
    return (float(t1) - float(t0)) / n, (_cpu_seconds(user) + _cpu_seconds(sys_)) / n


def rounds(fleet: SimFleet, args: argparse.Namespace, label: str) -> None:
    status = "bash -s </tmp/status.sh"
    walls, cpus, best = [], [], [float("inf"), float("inf")]
    for _ in range(args.rounds):
        sw, sc = measure(fleet, args.n, status)
        bw, bc = measure(fleet, args.n, BARE)
        walls.append(sw / bw)
        cpus.append(sc / bc)
        best = [min(best[0], sw), min(best[1], bw)]
        print(f"{label}: status {sw * 1000:6.1f} ms wall {sc * 1000:6.1f} ms cpu | "
              f"bare {bw * 1000:6.1f} ms wall {bc * 1000:6.1f} ms cpu")
    for name, xs in (("wall", walls), ("cpu", cpus)):
        print(f"{label}: {name} ratio status/bare: min {min(xs):.2f} median "
              f"{statistics.median(xs):.2f} max {max(xs):.2f}")
    print(f"{label}: best status {best[0] * 1000:.1f} ms / best bare {best[1] * 1000:.1f} ms"
          f" = {best[0] / best[1]:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--subnet", type=int, default=SUBNET, help="addresses 127.S.x.y")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fleet = SimFleet.up(1, Path(tmp), subnet=args.subnet)
        try:
            script = subprocess.run(
                [sys.executable, "-m", "fleetclean", "show", "status", "-i",
                 str(fleet.inventory_path), "--host", "node01"],
                capture_output=True, text=True, check=True).stdout
            fleet.node_path("node01", "/tmp/status.sh").write_text(script)
            rounds(fleet, args, "idle")
            fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
            rounds(fleet, args, "busy")
        finally:
            fleet.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
