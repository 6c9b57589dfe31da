"""Two test processes never pick the same simulated subnet, even before either fleet's
sshd listens (the window where a check of listeners alone let two workers collide)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import simhelp
from simhelp import claim_subnet, release_subnet

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def own_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims in a directory of this test's, apart from the fleets' of a run beside it."""
    monkeypatch.setattr(simhelp, "CLAIMS", tmp_path / "claims")


def other_process_claims(first: int, count: int, seed: int) -> int:
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import simhelp;"
            f" simhelp.CLAIMS = simhelp.Path({str(simhelp.CLAIMS)!r});"
            f" print(simhelp.claim_subnet({first}, {count}, {seed}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return int(done.stdout)


def test_a_subnet_claimed_here_is_skipped_by_another_process_until_released() -> None:
    mine = claim_subnet(250, 4, 0)
    try:
        theirs = other_process_claims(250, 4, mine - 250)
        assert theirs != mine and 250 <= theirs < 254
    finally:
        release_subnet(mine)
    assert other_process_claims(250, 4, mine - 250) == mine


def test_one_process_does_not_hand_out_a_subnet_it_holds_twice() -> None:
    first = claim_subnet(250, 2, 0)
    try:
        second = claim_subnet(250, 2, 0)
        release_subnet(second)
    finally:
        release_subnet(first)
    assert {first, second} == {250, 251}
