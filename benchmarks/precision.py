"""Randomized precision at size: seeded mixes torn down until 1,000 host teardowns are done.

Run as root on Linux: ``.venv/bin/python benchmarks/precision.py [--nodes 10] [--rounds 100]
[--seed 2026]``. It brings up its own simulated fleet on 127.250..254.x.y (away from the
tests' 20..89 and 100..249 and the other benchmarks' 90..99), runs ``tests/precisionmix.py``'s
rounds (the same mixes and checks as the CI sample in ``tests/reliability/test_precision.py``)
through the real CLI, in-process, and prints the counts: what was spawned, what was torn
down, and every kind of failure (a target left, a bystander signalled, a GPU not clean, ...),
each printed where it happens; exit status 1 if there was any. ``--baseline`` runs the same
mixes with the kill stages matching whole command lines (``match: cmdline``, ``scope: all``),
as before issue #13, to show what the suite's bystanders cost then. Not a CI test; the
figures are in RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from precisionmix import FAILURES, run_rounds  # noqa: E402
from simhelp import CliResult, listening  # noqa: E402

from fleetclean.cli import Env, main  # noqa: E402
from fleetclean.sim import SimFleet  # noqa: E402

SUBNETS = range(250, 255)


def free_subnet() -> int:
    for subnet in SUBNETS:
        if not listening(f"127.{subnet}.1.1"):
            return subnet
    raise RuntimeError("no free subnet in 127.250..254")


def in_process(*argv: str | Path) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    code = main([str(a) for a in argv], Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"}))
    return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def report(done: int, totals: Counter[str]) -> None:
    """One line per round on stderr: a long run can be followed, and read if cut short."""
    bad = {k: totals[k] for k in FAILURES if totals[k]}
    print(f"round {done + 1}: {totals['teardowns']} teardowns, {totals['target_pids']} targets, "
          f"{totals['bystander_pids']} bystanders, failures {bad or 0}", file=sys.stderr,
          flush=True)


def run(nodes: int, rounds: int, seed: int, baseline: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="fleetclean-precision-") as tmp:
        work = Path(tmp)
        os.environ["FLEETCLEAN_STATE_DIR"] = str(work / "state")
        t0 = time.monotonic()
        with SimFleet.up(nodes, work / "sim", subnet=free_subnet()) as fleet:
            totals = run_rounds(fleet, in_process, work, rounds=rounds, seed=seed,
                                strict=False, broad=baseline, progress=report)
        seconds = time.monotonic() - t0
    what = "baseline (match: cmdline, scope: all)" if baseline else "built-in kill stages"
    print(f"precision, {what}: {nodes} nodes x {rounds} rounds, seed {seed}, {seconds:.0f} s")
    for key, value in sorted(totals.items()):
        if key not in FAILURES:
            print(f"  {key}: {value}")
    print("failures:")
    for key in FAILURES:
        print(f"  {key}: {totals[key]}")
    print(f"hosts whose script never ran (transport failures, not judged): "
          f"{totals['hosts_not_run']}")
    return 1 if any(totals[k] for k in FAILURES) else 0


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--baseline", action="store_true",
                    help="kill stages match whole command lines, as before issue #13")
    args = ap.parse_args()
    return run(args.nodes, args.rounds, args.seed, args.baseline)


if __name__ == "__main__":
    sys.exit(cli())
