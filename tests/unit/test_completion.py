"""Shell completion: the generated scripts load in a real bash, and complete."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclean.cli import Env, main

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def generate(shell: str) -> str:
    out = io.StringIO()
    assert main(["completion", shell], Env(stdout=out, stderr=io.StringIO(), environ={})) == 0
    return out.getvalue()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "fleetclean.bash"
    path.write_text(generate("bash"))
    return path


@pytest.fixture
def shim(tmp_path: Path) -> Path:
    """A `fleetclean` on PATH that is this checkout's, for the script's hidden helper."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "fleetclean"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m fleetclean "$@"\n')
    exe.chmod(0o755)
    return bindir


def complete(script: Path, line: str, bindir: Path | None = None) -> list[str]:
    """COMPREPLY of `_fleetclean` for ``line`` (the cursor at its end)."""
    words = line.split(" ")
    driver = (f'source "{script}"\nCOMP_WORDS=({" ".join(repr(w) for w in words)})\n'
              f"COMP_CWORD={len(words) - 1}\n_fleetclean\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    env = dict(os.environ)
    if bindir is not None:
        env["PATH"] = f"{bindir}:{env['PATH']}"
    proc = subprocess.run([BASH or "bash", "-c", driver], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    return [w for w in proc.stdout.splitlines() if w]


def test_the_bash_script_parses_and_registers_the_function(script: Path) -> None:
    subprocess.run([BASH or "bash", "-n", str(script)], check=True)
    load = f'source <(cat "{script}"); complete -p fleetclean'
    shown = subprocess.run([BASH or "bash", "-c", load], capture_output=True, text=True,
                           check=True).stdout
    assert shown.strip() == "complete -F _fleetclean fleetclean"


def test_commands_complete(script: Path) -> None:
    assert complete(script, "fleetclean ru") == ["run"]
    assert {"run", "status", "show", "history", "completion"} <= set(
        complete(script, "fleetclean "))
    assert "__complete" not in complete(script, "fleetclean _")


def test_options_of_the_command_complete(script: Path) -> None:
    assert set(complete(script, "fleetclean run post-extraction --p")) == {"--prom"}
    assert "--watch" in complete(script, "fleetclean status --")
    assert "--watch" not in complete(script, "fleetclean run --")


def test_builtin_playbooks_complete(script: Path) -> None:
    assert complete(script, "fleetclean run post") == ["post-extraction"]
    assert complete(script, "fleetclean completion z") == ["zsh"]


def test_hosts_and_groups_come_from_the_inventory_given(
    script: Path, shim: Path, tmp_path: Path
) -> None:
    inv = tmp_path / "lab.yml"
    inv.write_text("all:\n  children:\n    training:\n      hosts:\n"
                   "        gpu[01:03].lab:\n    extraction:\n      hosts:\n        gpu09.lab:\n")
    got = complete(script, f"fleetclean run post-extraction -i {inv} -l gpu0", shim)
    assert got == ["gpu01.lab", "gpu02.lab", "gpu03.lab", "gpu09.lab"]
    assert complete(script, f"fleetclean status -i {inv} -l tr", shim) == ["training"]
    assert complete(script, "fleetclean status -l gpu", shim) == []  # no -i: nothing to read


def test_the_zsh_script_wraps_the_same_function() -> None:
    text = generate("zsh")
    assert text.startswith("#compdef fleetclean\n") and "bashcompinit" in text
    assert generate("bash") in text
    zsh = shutil.which("zsh")
    if zsh:
        subprocess.run([zsh, "-n", "-c", text], check=True)


def test_export_and_report_complete_their_commands_options_and_playbooks(script: Path) -> None:
    assert complete(script, "fleetclean export ") == ["slurm-epilog", "script"]
    options = set(complete(script, "fleetclean export script --"))
    assert {"--inventory", "--user", "--check"} <= options
    assert "--user" not in complete(script, "fleetclean export slurm-epilog --")
    assert complete(script, "fleetclean export slurm-epilog post") == ["post-extraction"]
    assert complete(script, "fleetclean report --f") == ["--from"]
