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

``--real``: on a machine with a real ``nvidia-smi`` and no simulator (a real H200 node),
the script is rendered for this machine (``fleetclean show status --local``) and run here
with bash, in the same alternating rounds against the same bare query, on the machine as
it is (idle or busy). Status only reads (nvidia-smi, /proc, the kernel log): nothing is
signalled. ``--out FILE`` also writes the figures as JSON, in either mode.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
Runner = Callable[[list[str]], str]  # argv -> its stdout, in the node or here


def _cpu_seconds(field: str) -> float:
    minutes, seconds = field.rstrip("s").split("m")
    return int(minutes) * 60 + float(seconds)


def measure(run: Runner, n: int, command: str) -> tuple[float, float]:
    """(wall, cpu) seconds per call of ``command``, run by ``run``."""
    stdout = run(["bash", "-c", TIMER, "timer", str(n), command])
    # `times` prints the shell's own CPU, then its children's: the calls are children.
    lines = stdout.splitlines()
    t0, t1 = lines[0].split()
    user, sys_ = lines[-1].split()
    return (float(t1) - float(t0)) / n, (_cpu_seconds(user) + _cpu_seconds(sys_)) / n


def rounds(run: Runner, args: argparse.Namespace, label: str, script: str) -> dict[str, Any]:
    status = f"bash -s <{script}"
    walls, cpus, best = [], [], [float("inf"), float("inf")]
    for _ in range(args.rounds):
        sw, sc = measure(run, args.n, status)
        bw, bc = measure(run, args.n, BARE)
        walls.append(sw / bw)
        cpus.append(sc / bc)
        best = [min(best[0], sw), min(best[1], bw)]
        print(f"{label}: status {sw * 1000:6.1f} ms wall {sc * 1000:6.1f} ms cpu | "
              f"bare {bw * 1000:6.1f} ms wall {bc * 1000:6.1f} ms cpu", flush=True)
    figures: dict[str, Any] = {"best_status_ms": best[0] * 1000,
                               "best_bare_ms": best[1] * 1000,
                               "best_ratio": best[0] / best[1]}
    for name, xs in (("wall", walls), ("cpu", cpus)):
        print(f"{label}: {name} ratio status/bare: min {min(xs):.2f} median "
              f"{statistics.median(xs):.2f} max {max(xs):.2f}")
        figures[f"{name}_ratio"] = {"min": min(xs), "median": statistics.median(xs),
                                    "max": max(xs)}
    print(f"{label}: best status {best[0] * 1000:.1f} ms / best bare {best[1] * 1000:.1f} ms"
          f" = {best[0] / best[1]:.2f}x")
    return figures


def local(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def real(args: argparse.Namespace) -> dict[str, Any]:
    """This machine as it is, with its own nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("node_status.py --real: no nvidia-smi on PATH")
    gpus = local(["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv,noheader"])
    print(f"this machine: {len(gpus.splitlines())} GPUs, {gpus.splitlines()[:1]} ...")
    script = local([sys.executable, "-m", "fleetclean", "show", "status", "--local"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "status.sh"
        path.write_text(script)
        return {"gpus": gpus.splitlines(), "as found": rounds(local, args, "as found",
                                                               str(path))}


def simulated(args: argparse.Namespace) -> dict[str, Any]:
    from fleetclean.sim import SimFleet

    with tempfile.TemporaryDirectory() as tmp:
        fleet = SimFleet.up(1, Path(tmp), subnet=args.subnet)
        try:
            script = local([sys.executable, "-m", "fleetclean", "show", "status", "-i",
                            str(fleet.inventory_path), "--host", "node01"])
            fleet.node_path("node01", "/tmp/status.sh").write_text(script)

            def in_node(argv: list[str]) -> str:
                return fleet.run_in("node01", argv).stdout

            figures = {"idle": rounds(in_node, args, "idle", "/tmp/status.sh")}
            fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
            figures["busy"] = rounds(in_node, args, "busy", "/tmp/status.sh")
            return figures
        finally:
            fleet.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--subnet", type=int, default=SUBNET, help="addresses 127.S.x.y")
    ap.add_argument("--real", action="store_true",
                    help="this machine's own nvidia-smi, no simulator (read-only)")
    ap.add_argument("--out", type=Path, metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()
    figures = real(args) if args.real else simulated(args)
    if args.out:
        doc = {"mode": "real" if args.real else "simulated", "rounds": args.rounds,
               "calls_per_round": args.n, **figures}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
