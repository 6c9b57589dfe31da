"""``status --watch`` starts itself again with glibc's thread caches off: once, with the
same arguments, and what it starts afterwards sees the user's own environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetclean.commands import memory

pytestmark = pytest.mark.skipif(memory.wanted({}) is None, reason="not Linux with glibc")

CHILD = """
import json, os, sys
from fleetclean.commands import memory
if sys.argv[1:2] == ["rewrite"]:
    sys.argv[1:] = ["something", "else"]  # a program that rewrote its own arguments
start = os.environ.get("GLIBC_TUNABLES")  # as this process (the last one) started
env = dict(os.environ)
memory.thread_caches_off(env)
print(json.dumps({
    "argv": sys.argv[1:],
    "started_with": start,
    "now": os.environ.get("GLIBC_TUNABLES"),
    "copy": env.get("GLIBC_TUNABLES"),
    "marker": [k for k in list(os.environ) + list(env) if k.startswith("FLEETCLEAN_GLIBC")],
    "child": os.popen("printenv GLIBC_TUNABLES || true").read().strip(),
}))
"""


def run_child(tmp_path: Path, *args: str, tunables: str | None = None,
              code: bool = False) -> dict[str, object]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    command = [sys.executable, "-c", CHILD] if code else [sys.executable, str(script)]
    out = subprocess.run([*command, *args], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return dict(json.loads(out))


def test_started_again_once_with_the_caches_off_and_the_same_arguments(
    tmp_path: Path
) -> None:
    seen = run_child(tmp_path, "status", "--watch", "2", "a b")
    assert seen["argv"] == ["status", "--watch", "2", "a b"]
    assert seen["started_with"] == memory.TUNABLE
    # After the start, nothing of it is left for the run's own children to inherit.
    assert seen["now"] is None and seen["copy"] is None and seen["marker"] == []
    assert seen["child"] == ""


def test_the_users_own_tunables_are_kept_and_given_back(tmp_path: Path) -> None:
    seen = run_child(tmp_path, "x", tunables="glibc.malloc.arena_max=2")
    assert seen["started_with"] == f"glibc.malloc.arena_max=2:{memory.TUNABLE}"
    assert seen["now"] == seen["copy"] == seen["child"] == "glibc.malloc.arena_max=2"


def test_a_users_own_cache_count_or_code_that_cannot_be_started_again_is_left_alone(
    tmp_path: Path
) -> None:
    mine = "glibc.malloc.tcache_count=2"
    seen = run_child(tmp_path, tunables=mine)
    assert seen["started_with"] == seen["now"] == mine
    # -c code: its text is in orig_argv, but a program from stdin would not be: never
    # started again from anything but a script or a module.
    assert run_child(tmp_path, "y", code=True)["started_with"] is None


def test_a_program_that_rewrote_its_arguments_is_not_started_again(tmp_path: Path) -> None:
    # Started again from sys.orig_argv, it would run with arguments it no longer has.
    assert run_child(tmp_path, "rewrite", "x")["started_with"] is None
