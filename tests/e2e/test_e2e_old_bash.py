"""Nodes whose bash is older than 5.0: RHEL 8 and its rebuilds (Rocky, Alma) ship bash 4.4,
which has no EPOCHREALTIME. Every clock read of the scripts was then empty, so that no grace
and no deadline ever ended: a holder that ignores SIGTERM was never sent SIGKILL, and the
script never finished, holding the node's lock. lib.sh reads the kernel's uptime there.

The first test runs on any machine: bash 5's EPOCHREALTIME unset before the script loads
(bash 4.4 has none). The second runs the real thing where a bash 4.4 binary is given
(``FLEETCLEAN_TEST_OLD_BASH=PATH``; one is built in a minute from bash's own sources, tag
bash-4.4): the node runs it for fleetclean's runs over SSH (its /usr/local/sbin, first in
PATH, is the node's own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, alive, skip_unless_own_root

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import render_script
from fleetclean.engine.variables import resolve
from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
OLD_BASH = os.environ.get("FLEETCLEAN_TEST_OLD_BASH", "")


def signals(stdout: str) -> list[tuple[int, str]]:
    return [(int(f[3]), f[4]) for f in (line.split("\t") for line in stdout.splitlines())
            if f[:2] == ["@@fleetclean", "signal"]]


def test_without_epochrealtime_a_stubborn_holder_still_gets_sigkill_after_its_grace(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    fleet = sim_fleet_factory(1)
    stubborn = fleet.spawn("node01", "stubborn", gpu=1, mib=2048)
    script = render_script(resolve(load_playbook("post-extraction"), {}, {"grace": 1}),
                           host_name="node01")
    fleet.node_path("node01", "/tmp/pe.sh").write_text(script)
    started = time.monotonic()
    try:
        run = fleet.run_in("node01", ["bash", "-c", "unset EPOCHREALTIME; . /tmp/pe.sh"],
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the script never finished: its clock stood still")
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    assert signals(run.stdout) == [(stubborn[0], "TERM"), (stubborn[0], "KILL")]
    assert "\tverify\tok\t" in run.stdout
    assert alive(fleet, "node01", stubborn) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    # The grace was waited for, by a clock that moves: not skipped, not endless.
    assert 1.0 <= took < 30, took


@pytest.mark.skipif(not OLD_BASH, reason="no bash 4.4 given (FLEETCLEAN_TEST_OLD_BASH=PATH)")
@pytest.mark.parametrize("posixly_correct", [False, True])
def test_a_node_with_bash_4_4_is_read_named_and_cleaned_over_ssh(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, posixly_correct: bool
) -> None:
    fleet = sim_fleet_factory(1)
    if posixly_correct:
        # A login that exports it starts every bash in POSIX mode, where bash 4.4 takes a
        # process substitution for a syntax error (transport/boot.py: POSIX_OFF).
        skip_unless_own_root(fleet)
        fleet.node_path("node01", "/root/.bashrc").write_text("export POSIXLY_CORRECT=1\n")
    bash = fleet.node_path("node01", "/usr/local/sbin/bash")
    shutil.copy(OLD_BASH, bash)
    version = fleet.run_in("node01", ["sh", "-c", "exec bash -c 'echo $BASH_VERSION'"])
    assert version.stdout.startswith("4.4"), version.stdout
    server = fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
    stubborn = fleet.spawn("node01", "stubborn", gpu=1, mib=2048)

    status = cli("status", "-i", fleet.inventory_path, "--json")
    host = status.host("node01")
    assert host["status"] == "dirty"
    named = {p["pid"] for g in host["gpus"] for p in g["processes"]}
    assert stubborn[0] in named and len(named & set(server)) == 8

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=1",
              "--json")
    assert res.host("node01")["status"] == "clean", res.out
    assert alive(fleet, "node01", server + stubborn) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert Path(bash).exists()
