"""Randomized precision, a CI sample: 50 seeded host teardowns (tests/precisionmix.py says
what each round spawns and checks). The large run, 1,000 teardowns, is
``benchmarks/precision.py``; both figures are in RELIABILITY.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from precisionmix import run_rounds
from simhelp import Cli

pytestmark = pytest.mark.sim


@pytest.mark.slow
def test_precision_50_teardowns(sim_fleet_factory: Any, cli: Cli, tmp_path: Path) -> None:
    fleet = sim_fleet_factory(5)
    totals = run_rounds(fleet, cli, tmp_path, rounds=10, seed=1)
    print(f"precision 5x10: {dict(totals)}")
    assert totals["teardowns"] == 50
