"""Every benchmark script starts: its imports resolve and it prints its usage. The
benchmarks are not run in CI (they take minutes to hours), so an import one of them lost in
a refactoring (epilog.py's ``machine``, moved from run.py to report.py) was found only when
someone next ran it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "report.py")


def test_every_script_is_listed() -> None:
    assert {"run.py", "peers.py", "scale.py", "epilog.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_prints_its_usage(name: str) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")
