"""Golden files of the rendered built-in scripts, and shellcheck on templates and scripts.

A golden script keeps the script's own part (header, stage templates, ``fc_main``) with
``lib.sh``'s text, which every script carries, replaced by one marker line; ``lib.sh`` is
pinned once, by its SHA-256 in ``lib.sh.sha256`` (its diff is reviewed in git).
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
LIBRARIES = ("lib.sh", "lib-kill.sh")


def marker(lib: str) -> str:
    return f"# [{lib}: a stage library, pinned by tests/data/golden/lib.sh.sha256]\n"


CASES = {
    "post-extraction": ({}, False),
    "post-extraction-check": ({"model_file": "/opt/sglang/models/deepseek_v2.py",
                               "guard_path": "/dev/shm/sglang_hs", "protect": "jupyter"}, True),
    "pre-restart": ({}, False),
    "free-gpus": ({"reset_leaked": "true"}, False),
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
    """The script with each library's text (right after the header) replaced by a marker:
    lib.sh once in every script, lib-kill.sh once where a stage signals, else not at all."""
    lib = template("lib.sh")
    assert script.count(lib) == 1, "lib.sh must appear once, whole, in every script"
    assert script.count(template("lib-kill.sh")) <= 1
    for name in LIBRARIES:
        script = script.replace(template(name), marker(name))
    return script


def check_golden(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with FLEETCLEAN_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; regenerate and review the diff"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_rendered_script(case: str) -> None:
    check_golden(GOLDEN / f"{case}.sh", own_part(rendered(case)))


def test_golden_lib_sh() -> None:
    lines = [f"{hashlib.sha256(template(lib).encode()).hexdigest()}  "
             f"fleetclean/engine/stages/{lib}" for lib in LIBRARIES]
    check_golden(GOLDEN / "lib.sh.sha256", "\n".join(lines) + "\n")


def test_a_status_script_carries_no_kill_library() -> None:
    assert marker("lib-kill.sh") not in own_part(rendered("status"))
    assert marker("lib-kill.sh") in own_part(rendered("pre-restart"))


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
