"""Golden files of the rendered built-in scripts, and shellcheck on templates and scripts.

A golden script keeps the script's own part (header, stage templates, ``fc_main``) with
the text of ``lib.sh`` and ``owner.sh``, which every script carries, replaced by one marker
line each; those two are pinned once, by their SHA-256 in ``lib.sh.sha256`` and
``owner.sh.sha256`` (their diffs are reviewed in git).
Regenerate all of them after an intended change, then review the diff:

    FLEETCLEAN_REGEN_GOLDEN=1 .venv/bin/pytest tests/engine -k golden
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import render_script
from fleetclean.engine.stages import template
from fleetclean.engine.variables import resolve

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
STAGES = ROOT / "fleetclean" / "engine" / "stages"
REGEN = os.environ.get("FLEETCLEAN_REGEN_GOLDEN") == "1"
LIB_MARKER = "# [lib.sh: the stage library, pinned by tests/data/golden/lib.sh.sha256]\n"
OWNER_MARKER = "# [owner.sh: owner attribution, pinned by tests/data/golden/owner.sh.sha256]\n"

CASES = {
    "post-extraction": ({}, False),
    "post-extraction-check": ({"model_file": "/opt/sglang/models/deepseek_v2.py",
                               "guard_path": "/dev/shm/sglang_hs", "protect": "jupyter"}, True),
    "pre-restart": ({}, False),
    "status": ({}, False),
}


def shellcheck() -> str | None:
    local = Path(sys.executable).parent / "shellcheck"
    return str(local) if local.exists() else shutil.which("shellcheck")


def rendered(case: str) -> str:
    extra, check = CASES[case]
    pb = load_playbook(case.removesuffix("-check"))
    return render_script(resolve(pb, {}, extra), check=check, host_name="node01")


def own_part(script: str) -> str:
    """The script with the text of lib.sh and owner.sh (right after the header) replaced by
    markers."""
    for name, marker in (("lib.sh", LIB_MARKER), ("owner.sh", OWNER_MARKER)):
        text = template(name)
        assert script.count(text) == 1, f"{name} must appear once, whole, in every script"
        script = script.replace(text, marker)
    return script


def check_golden(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with FLEETCLEAN_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; regenerate and review the diff"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_rendered_script(case: str) -> None:
    check_golden(GOLDEN / f"{case}.sh", own_part(rendered(case)))


@pytest.mark.parametrize("name", ["lib.sh", "owner.sh"])
def test_golden_libraries(name: str) -> None:
    digest = hashlib.sha256(template(name).encode()).hexdigest()
    check_golden(GOLDEN / f"{name}.sha256", f"{digest}  fleetclean/engine/stages/{name}\n")


@pytest.mark.skipif(shellcheck() is None, reason="shellcheck not installed")
def test_golden_scripts_pass_shellcheck(tmp_path: Path) -> None:
    files = []
    for case in CASES:
        f = tmp_path / f"{case}.sh"
        f.write_text(rendered(case))
        files.append(str(f))
    out = subprocess.run([str(shellcheck()), "-s", "bash", *files], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stdout


@pytest.mark.skipif(shellcheck() is None, reason="shellcheck not installed")
def test_stage_templates_pass_shellcheck() -> None:
    files = sorted(str(p) for p in STAGES.glob("*.sh"))
    out = subprocess.run([str(shellcheck()), *files], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout


def test_hostile_values_are_quoted_in_the_script() -> None:
    pb = load_playbook("post-extraction")
    hostile = "/dev/shm/x'; touch /tmp/pwned #$(id)`id`\n*"
    script = render_script(resolve(pb, {}, {"dump_dir": hostile}))
    assert "opt_paths=('/dev/shm/x'\"'\"'; touch /tmp/pwned #$(id)`id`\n*')" in script
