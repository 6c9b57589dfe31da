"""The controller's own start-up: wall time and import time of a few invocations.

Run as root on Linux (the status rows need a simulated fleet; ``--no-sim`` skips them):
``.venv/bin/python benchmarks/startup.py [--reps 9]``. Every row is the median (min-max)
over the repetitions of this one run, and its ratio to ``python -c pass`` measured in the
same run, interleaved with the others so that a busy machine slows every row alike.

``import ms`` is what ``-X importtime`` says the interpreter spent importing (the sum of
its top-level cumulative times), so it leaves out the interpreter's own start and the run.
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

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SUBNETS = range(92, 100)  # away from tests (20..89, 100..249) and the other benchmarks


def import_ms(stderr: str) -> float:
    """Sum of top-level cumulative import times (µs in -X importtime's output) in ms.

    >>> import_ms("import time: self [us] | cumulative | imported package\\n"
    ...           "import time:       10 |         10 |   a\\n"
    ...           "import time:       20 |         30 | b\\n")
    0.03
    """
    total = 0
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.split("|")
        if len(parts) != 3:
            continue
        _, cumulative, name = parts
        if cumulative.strip().isdigit() and not name.startswith("  "):
            total += int(cumulative)
    return total / 1000


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, import ms) of one run of argv under -X importtime."""
    env = dict(os.environ, NO_COLOR="1")
    started = time.perf_counter()
    done = subprocess.run([PYTHON, "-X", "importtime", *argv], capture_output=True, text=True,
                          env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr[-400:]}")
    return wall, import_ms(done.stderr)


def free_subnet() -> int:
    for subnet in SUBNETS:
        want = "{:08X}:0016".format(int.from_bytes(bytes((127, subnet, 1, 1)), "little"))
        with open("/proc/net/tcp") as f:
            if not any(line.split()[1] == want for line in list(f)[1:]):
                return subnet
    raise SystemExit("no free 127.S.0.0/16 in 92..99")


def fmt(values: list[float], unit: str) -> str:
    return (f"{statistics.median(values):.{3 if unit == 's' else 1}f} {unit} "
            f"({min(values):.3g}-{max(values):.3g})")


def measure(rows: dict[str, list[str]], reps: int) -> None:
    walls: dict[str, list[float]] = {name: [] for name in rows}
    imports: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(reps):
        for name, argv in rows.items():  # interleaved: load drifts hit every row alike
            wall, imp = timed(argv)
            walls[name].append(wall)
            imports[name].append(imp)
    base = statistics.median(walls["python -c pass"])
    print(f"{'invocation':<44} {'wall median (min-max)':<26} {'x pass':>7}  "
          "import ms median (min-max)")
    for name in rows:
        ratio = statistics.median(walls[name]) / base
        print(f"{name:<44} {fmt(walls[name], 's'):<26} {ratio:>6.2f}x  "
              f"{fmt(imports[name], 'ms')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--no-sim", action="store_true", help="skip the rows that need a fleet")
    args = ap.parse_args()
    rows = {
        "python -c pass": ["-c", "pass"],
        "fleetclean --version": ["-m", "fleetclean", "--version"],
        "fleetclean status --help": ["-m", "fleetclean", "status", "--help"],
        "fleetclean playbooks": ["-m", "fleetclean", "playbooks"],
    }
    if args.no_sim:
        measure(rows, args.reps)
        return 0
    from fleetclean.sim import SimFleet

    with tempfile.TemporaryDirectory(prefix="fleetclean-startup-") as tmp, \
            SimFleet.up(2, Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
        where = ["-i", str(fleet.inventory_path), "-F", str(fleet.ssh_config_path)]
        rows["fleetclean status (2 sim nodes, table)"] = ["-m", "fleetclean", "status", *where]
        rows["fleetclean status (2 sim nodes, --json)"] = ["-m", "fleetclean", "status",
                                                          *where, "--json"]
        measure(rows, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
