"""Randomized precision at size: seeded mixes torn down until 1,000 host teardowns are done.

Run as root on Linux: ``.venv/bin/python benchmarks/precision.py [--nodes 10] [--rounds 100]
[--seed 2026]``. It brings up its own simulated fleet on 127.250..254.x.y (away from the
tests' 20..89 and 100..249 and the other benchmarks' 90..99), runs ``tests/precisionmix.py``'s
rounds (the same mixes and checks as the CI sample in ``tests/reliability/test_precision.py``)
through the real CLI, in-process, and prints the counts. Any failure stops the run with the
seed, the round and the host, and exit status 1. Not a CI test; the figures are in
RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from precisionmix import run_rounds  # noqa: E402
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


def run(nodes: int, rounds: int, seed: int) -> int:
    with tempfile.TemporaryDirectory(prefix="fleetclean-precision-") as tmp:
        work = Path(tmp)
        os.environ["FLEETCLEAN_STATE_DIR"] = str(work / "state")
        t0 = time.monotonic()
        with SimFleet.up(nodes, work / "sim", subnet=free_subnet()) as fleet:
            try:
                totals = run_rounds(fleet, in_process, work, rounds=rounds, seed=seed)
            except AssertionError as exc:
                print(f"FAILED: {exc}", file=sys.stderr)
                return 1
        seconds = time.monotonic() - t0
    print(f"precision {nodes} nodes x {rounds} rounds, seed {seed}, {seconds:.0f} s:")
    for key, value in sorted(totals.items()):
        print(f"  {key}: {value}")
    return 0


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    return run(args.nodes, args.rounds, args.seed)


if __name__ == "__main__":
    sys.exit(cli())
