"""The controller's own start-up: wall time and import time of a few invocations.

Run as root on Linux (the status rows need a simulated fleet; ``--no-sim`` skips them):
``.venv/bin/python benchmarks/startup.py [--reps 9]``. Every row is the median (min-max)
over the repetitions of this one run, and its ratio to ``python -c pass`` measured in the
same run, interleaved with the others so that a busy machine slows every row alike.

``cpu ms`` is the command's own CPU time (user and system, from its rusage): on a loaded
machine, where wall time mostly measures waiting for a core, it is the steadier figure.
``import ms`` is what ``-X importtime`` says the interpreter spent importing (the sum of
its top-level cumulative times), so it leaves out the interpreter's own start and the run;
``run ms`` is what is left of the median wall once ``python -c pass`` and the imports
beyond its own are taken out: the command's own work.

``--real``: on a machine with a real ``nvidia-smi`` and no simulator (a real H200 node),
the rows are ``fleetclean status --local`` (table and ``--json``: this machine, no SSH),
which only reads. ``--out FILE`` also writes the rows as JSON.

``--against CHECKOUT``: every row also runs from another checkout (with its own ``.venv``
where it has one), interleaved with this one's against the same fleet, labelled with each
checkout's directory name: before and after a change in one run, e.g. ``--against
/work/main`` from a branch's worktree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def python_of(checkout: Path) -> str:
    """The checkout's venv where there is one; else (a GPU machine that only has the
    checkout) the interpreter running this."""
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def timed(checkout: Path, argv: list[str]) -> tuple[float, float, float]:
    """(wall s, import ms, cpu ms) of one run of argv under -X importtime, from ``checkout``
    (whose directory ``-m fleetclean`` then finds first)."""
    env = dict(os.environ, NO_COLOR="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([python_of(checkout), "-X", "importtime", *argv], cwd=checkout,
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv}: exit {done.returncode}: {done.stderr[-400:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, import_ms(done.stderr), cpu * 1000


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


def measure(rows: dict[str, list[str]], checkouts: list[Path],
            reps: int) -> list[dict[str, object]]:
    labelled = len(checkouts) > 1
    width = 56 if labelled else 44
    runs = {(name, checkout): argv for name, argv in rows.items() for checkout in checkouts}
    walls: dict[tuple[str, Path], list[float]] = {key: [] for key in runs}
    imports: dict[tuple[str, Path], list[float]] = {key: [] for key in runs}
    cpus: dict[tuple[str, Path], list[float]] = {key: [] for key in runs}
    for _ in range(reps):
        for key, argv in runs.items():  # interleaved: load drifts hit every row alike
            wall, imp, cpu = timed(key[1], argv)
            walls[key].append(wall)
            imports[key].append(imp)
            cpus[key].append(cpu)
    print(f"{'invocation':<{width}} {'wall median (min-max)':<26} "
          f"{'x pass':>7}  {'import ms median (min-max)':<28} run ms  cpu ms")
    out: list[dict[str, object]] = []
    for (name, checkout), wall_s in walls.items():
        base = statistics.median(walls["python -c pass", checkout])
        base_imp = statistics.median(imports["python -c pass", checkout])
        wall, imp = statistics.median(wall_s), statistics.median(imports[name, checkout])
        # What `pass` costs (the interpreter, site's imports) is in every row: taken out once.
        run_ms = max(0.0, (wall - base) * 1000 - (imp - base_imp))
        label = f"{name} [{checkout.name}]" if labelled else name
        print(f"{label:<{width}} {fmt(wall_s, 's'):<26} {wall / base:>6.2f}x  "
              f"{fmt(imports[name, checkout], 'ms'):<28} {run_ms:<7.0f} "
              f"{statistics.median(cpus[name, checkout]):.0f}")
        out.append({"invocation": name, "checkout": str(checkout), "wall_s": wall_s,
                    "import_ms": imports[name, checkout], "run_ms": run_ms,
                    "cpu_ms": cpus[name, checkout]})
    if labelled:
        paired(walls, imports, cpus, rows, checkouts)
    return out


def paired(walls: dict[tuple[str, Path], list[float]],
           imports: dict[tuple[str, Path], list[float]],
           cpus: dict[tuple[str, Path], list[float]],
           rows: dict[str, list[str]], checkouts: list[Path]) -> None:
    """This checkout minus the other, rep by rep (the two ran back to back), medians: a
    drift in load cancels out, which the medians of each row alone do not."""
    this, other = checkouts
    print(f"\n{this.name} - {other.name}, paired medians: wall ms, import ms, cpu ms")
    for name in rows:
        diffs = [
            statistics.median(scale * (a - b) for a, b in zip(series[name, this],
                                                              series[name, other], strict=True))
            for series, scale in ((walls, 1000), (imports, 1), (cpus, 1))
        ]
        print(f"{name:<44} " + "  ".join(f"{d:+7.1f}" for d in diffs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--no-sim", action="store_true", help="skip the rows that need a fleet")
    ap.add_argument("--real", action="store_true",
                    help="fleetclean status --local on this machine's nvidia-smi, no simulator")
    ap.add_argument("--out", type=Path, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--against", type=Path, metavar="CHECKOUT",
                    help="also run every row from this checkout, interleaved (before/after)")
    args = ap.parse_args()
    checkouts = [ROOT, *([args.against.resolve()] if args.against else [])]
    rows = {
        "python -c pass": ["-c", "pass"],
        "fleetclean --version": ["-m", "fleetclean", "--version"],
        "fleetclean status --help": ["-m", "fleetclean", "status", "--help"],
        "fleetclean playbooks": ["-m", "fleetclean", "playbooks"],
    }
    if args.real:
        rows["fleetclean status --local (table)"] = ["-m", "fleetclean", "status", "--local"]
        rows["fleetclean status --local --json"] = ["-m", "fleetclean", "status", "--local",
                                                    "--json"]
    if args.no_sim or args.real:
        save(measure(rows, checkouts, args.reps), args)
        return 0
    from fleetclean.sim import SimFleet

    with tempfile.TemporaryDirectory(prefix="fleetclean-startup-") as tmp, \
            SimFleet.up(2, Path(tmp) / "fleet", subnet=free_subnet()) as fleet:
        where = ["-i", str(fleet.inventory_path), "-F", str(fleet.ssh_config_path)]
        rows["fleetclean status (2 sim nodes, table)"] = ["-m", "fleetclean", "status", *where]
        rows["fleetclean status (2 sim nodes, --json)"] = ["-m", "fleetclean", "status",
                                                          *where, "--json"]
        save(measure(rows, checkouts, args.reps), args)
    return 0


def save(results: list[dict[str, object]], args: argparse.Namespace) -> None:
    if args.out:
        doc = {"mode": "real" if args.real else "simulated", "reps": args.reps,
               "rows": results}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"rows written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
