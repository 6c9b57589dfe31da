"""What becoming root through sudo costs, against a root login, on one simulated fleet.

Run as root on Linux: ``.venv/bin/python benchmarks/become.py [--nodes 8] [--reps 5]``.
Every row is the median (min-max) wall time of the real CLI (a subprocess) over the
repetitions, interleaved with the root login's so that a busy machine slows every row
alike, and its ratio to that root login. Rows: ``status`` and a ``pre-restart`` teardown of
one stubborn GPU holder per node, each as root, as ``ops`` with ``-b`` (sudo NOPASSWD), as
``alice`` with ``-b`` and her password (sudo's prompt answered), and as ``ops`` without
become; then how long each of sudo's refusals takes to come back (one node).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fleetclean.sim import SimFleet

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SUBNET = 88  # away from the default fleet (0), the other benchmarks (90, 91) and tests


def inventory(fleet: SimFleet, path: Path, user: str, **more: Any) -> Path:
    data = yaml.safe_load(fleet.inventory_path.read_text())
    for host in data["all"]["hosts"].values():
        host.update(ansible_user=user, **more)
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    return path


def timed(argv: list[str], state: Path) -> float:
    env = dict(os.environ, NO_COLOR="1", FLEETCLEAN_STATE_DIR=str(state))
    started = time.perf_counter()
    done = subprocess.run([PYTHON, "-m", "fleetclean", *argv], capture_output=True, text=True,
                          env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1, 2):
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr[-400:]}")
    return wall


def show(label: str, values: list[float], base: list[float] | None) -> None:
    med = statistics.median(values)
    ratio = f"{med / statistics.median(base):5.2f}x" if base else ""
    print(f"  {label:<44} {med:6.3f} s ({min(values):.3f}-{max(values):.3f})  {ratio}")


def logins(fleet: SimFleet, tmp: Path) -> dict[str, Path]:
    password = fleet.sudo_password
    return {
        "root login": fleet.inventory_path,
        "ops, -b (sudo NOPASSWD)": inventory(fleet, tmp / "ops-b.yml", "ops",
                                             ansible_become=True),
        "alice, -b with password (sudo asks)": inventory(
            fleet, tmp / "alice-b.yml", "alice", ansible_become=True,
            ansible_become_password=password),
        "ops without become": inventory(fleet, tmp / "ops.yml", "ops"),
    }


def compare(fleet: SimFleet, tmp: Path, reps: int) -> None:
    invs = logins(fleet, tmp)
    for playbook in ("status", "pre-restart"):
        times: dict[str, list[float]] = {k: [] for k in invs}
        for _ in range(reps):
            for label, inv in invs.items():
                if playbook != "status":
                    owner = "ops" if label.startswith("ops without") else "root"
                    for node in fleet.nodes:
                        fleet.spawn(node, "stubborn", gpu=1, user=owner)
                argv = ["status"] if playbook == "status" else ["run", playbook, "-e", "grace=0.2"]
                times[label].append(timed([*argv, "-i", str(inv)], tmp / "state"))
        print(f"{playbook}, {len(fleet.nodes)} nodes, median of {reps} (ratio to root login):")
        for label, values in times.items():
            show(label, values, times["root login"])


def refusals(fleet: SimFleet, tmp: Path, reps: int) -> None:
    password = fleet.sudo_password
    cases = {
        "wrong password": inventory(fleet, tmp / "w.yml", "alice", ansible_become=True,
                                    ansible_become_password="not-it"),
        "no password given": inventory(fleet, tmp / "n.yml", "alice", ansible_become=True),
        "no sudo rights": inventory(fleet, tmp / "r.yml", "bob", ansible_become=True,
                                    ansible_become_password=password),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(reps):
        for label, inv in cases.items():
            times[label].append(timed(["status", "-i", str(inv), "-l", "node01"], tmp / "state"))
    print(f"sudo's refusals, 1 node, median of {reps}:")
    for label, values in times.items():
        show(label, values, None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        fleet = SimFleet.up(args.nodes, tmp / "fleet", subnet=SUBNET)
        try:
            compare(fleet, tmp, args.reps)
            refusals(fleet, tmp, args.reps)
        finally:
            fleet.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
