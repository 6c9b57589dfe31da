"""Classification at scale: does every host get the status the simulator knows is true?

Run as root on Linux: ``.venv/bin/python benchmarks/scale.py [--nodes 256] [--forks 64]``
(``--nodes 1000`` for the issue's size). It brings up N simulated nodes, makes some busy
(an SGLang tp8 server on every 10th node, a SIGTERM-ignoring holder, a slow-to-exit one),
breaks some (nvidia-smi exit 18) and makes some slow to log in (``sim fault NODE
slow-banner S`` where this simulator has it; skipped and said so where not), then runs
``status`` (several times), ``post-extraction`` and ``status`` again with ``--json``.

Truth comes from the simulator itself, read just before (status) or just after
(post-extraction) each run: a node whose nvidia-smi cannot answer must be ``error``, one with
memory in use ``dirty``, the others ``clean``. A node made slow on purpose may also be
``timeout`` (the issue: slow is timeout or late success, never ``auth_failed``).

Per command it prints wall time, misclassified hosts, the controller's CPU per host and its
peak RSS: user+sys and ru_maxrss of that one child from ``os.wait4`` (so the simulator's
own processes are not counted). Exit status 1 when any host was misclassified. Not a CI test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
FLEETCLEAN = str(ROOT / ".venv" / "bin" / "fleetclean")
SUBNETS = range(92, 100)  # away from tests (20..89, 100..249) and the other benchmarks
SLOW_LOGIN_S = 2.0


@dataclass
class Run:
    label: str
    wall_s: float
    cpu_s: float
    maxrss_mib: float
    code: int
    hosts: dict[str, str]  # host -> status


def free_subnet() -> int:
    for subnet in SUBNETS:
        want = "{:08X}:0016".format(int.from_bytes(bytes((127, subnet, 1, 1)), "little"))
        with open("/proc/net/tcp") as f:
            if not any(line.split()[1] == want for line in list(f)[1:]):
                return subnet
    raise SystemExit("no free 127.S.0.0/16 in 92..99")


def controller(label: str, argv: list[str]) -> Run:
    """Run fleetclean once; its own CPU and peak RSS come from wait4 on that child."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([FLEETCLEAN, *argv], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        try:
            data: dict[str, Any] = json.loads(out.read())
        except ValueError:
            raise SystemExit(f"{label}: no JSON (exit {proc.returncode}): "
                             f"{err.read().decode()[-400:]}") from None
    return Run(label, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
               proc.returncode, {h["host"]: h["status"] for h in data["hosts"]})


def truth(fleet: SimFleet, names: list[str]) -> dict[str, str]:
    """What each node really is now, read through the simulator, not through SSH."""
    known = {}
    for name in names:
        used = fleet.gpu_used_mib(name)
        known[name] = "error" if not used else "dirty" if any(used) else "clean"
    return known


def slow_banner_supported() -> bool:
    done = subprocess.run([FLEETCLEAN, "sim", "fault", "--help"], capture_output=True,
                          text=True, check=False)
    return "slow-banner" in done.stdout


def prepare(fleet: SimFleet, *, slow_logins: bool) -> tuple[Counter[str], set[str]]:
    """Workloads and faults by node index; returns what was set up and the slow nodes."""
    made: Counter[str] = Counter()
    slow: set[str] = set()
    for i, node in enumerate(fleet.nodes, start=1):
        name = node.name
        if i % 10 == 1:
            fleet.spawn(name, "sglang")
            made["sglang tp8"] += 1
        elif i % 20 == 5:
            fleet.spawn(name, "stubborn", gpu=3)
            made["stubborn (ignores SIGTERM)"] += 1
        elif i % 32 == 7:
            fleet.spawn(name, "slow", gpu=2, delay=3.0)
            made["slow to exit (3 s)"] += 1
        elif i % 50 == 13:
            fleet.set_fault(name, "nvml")
            made["nvidia-smi exit 18"] += 1
        if slow_logins and i % 25 == 9:
            subprocess.run([FLEETCLEAN, "sim", "fault", name, "slow-banner",
                            f"{SLOW_LOGIN_S:g}", "--state-dir", str(fleet.state_dir)],
                           check=True, capture_output=True)
            slow.add(name)
            made[f"slow login ({SLOW_LOGIN_S:g} s banner)"] += 1
    return made, slow


def misclassified(run: Run, known: dict[str, str], slow: set[str]) -> list[str]:
    wrong = []
    for host, want in known.items():
        got = run.hosts.get(host, "missing")
        if got != want and not (host in slow and got == "timeout"):
            wrong.append(f"{host}: {got}, simulator says {want}")
    return wrong


def report(run: Run, wrong: list[str], nodes: int) -> None:
    counts = ", ".join(f"{s} {n}" for s, n in sorted(Counter(run.hosts.values()).items()))
    print(f"{run.label:<20} {run.wall_s:>7.2f} {len(wrong):>5}/{nodes:<5} "
          f"{run.cpu_s * 1000 / nodes:>10.1f} {run.maxrss_mib:>9.1f}   {counts}")
    for line in wrong[:10]:
        print(f"    {line}")
    if len(wrong) > 10:
        print(f"    … {len(wrong) - 10} more")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--forks", type=int, default=64)
    ap.add_argument("--status-reps", type=int, default=3)
    args = ap.parse_args()
    slow_logins = slow_banner_supported()
    with tempfile.TemporaryDirectory(prefix="fleetclean-scale-") as tmp:
        started = time.perf_counter()
        with SimFleet.up(args.nodes, Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
            up_s = time.perf_counter() - started
            made, slow = prepare(fleet, slow_logins=slow_logins)
            names = [n.name for n in fleet.nodes]
            print(f"{args.nodes} nodes up in {up_s:.1f} s; "
                  + ", ".join(f"{k}: {v}" for k, v in made.items())
                  + ("" if slow_logins else "; slow logins: no slow-banner fault in this "
                     "simulator, skipped"))
            where = ["-i", str(fleet.inventory_path), "-F", str(fleet.ssh_config_path),
                     "-f", str(args.forks), "--json"]
            print(f"{'command':<20} {'wall s':>7} {'misclassified':>11} {'CPU ms/host':>10} "
                  f"{'RSS MiB':>9}   statuses")
            total_wrong = 0
            plan = [(f"status #{r + 1}", ["status", *where]) for r in range(args.status_reps)]
            plan += [("post-extraction", ["run", "post-extraction", *where, "--no-record",
                                          "-e", "grace=1"]),
                     ("status after", ["status", *where])]
            for label, argv in plan:
                before = truth(fleet, names) if argv[0] == "status" else None
                run = controller(label, argv)
                known = before or truth(fleet, names)
                wrong = misclassified(run, known, slow)
                total_wrong += len(wrong)
                report(run, wrong, args.nodes)
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
