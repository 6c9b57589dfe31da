"""Scripts carry the packaged bash without its comment and blank lines (render.carried):
what bash defines from each file, every function and every variable, is the same with and
without them, so nothing that runs is cut. bash prints functions from what it parsed
(``declare -f``), comments left out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.render import carried

STAGES = Path(__file__).resolve().parents[2] / "fleetclean" / "engine" / "stages"
# Source the file, then print what it defined: functions, and fleetclean's variables
# (FC_*, opt_*; bash's own, RANDOM or EPOCHREALTIME, change between two runs).
DUMP = r"""
source "$1" >/dev/null 2>&1
declare -f
for v in $(compgen -v); do [[ $v == FC_* || $v == opt_* ]] && declare -p "$v"; done; true
"""


def defined(path: Path) -> str:
    done = subprocess.run(["bash", "-c", DUMP, "dump", str(path)], capture_output=True,
                          text=True, timeout=30, check=True, env={"PATH": "/usr/bin:/bin"})
    return done.stdout


@pytest.mark.parametrize("name", sorted(p.name for p in STAGES.glob("*.sh")))
def test_a_file_carried_without_its_comments_defines_the_same(name: str,
                                                              tmp_path: Path) -> None:
    text = (STAGES / name).read_text(encoding="utf-8")
    short = tmp_path / name
    short.write_text(carried(text))
    full = defined(STAGES / name)
    assert "() \n" in full  # it defines functions: the comparison compares something
    assert defined(short) == full
    assert len(short.read_bytes()) < len(text.encode())
