"""A server that a shell runs again in a loop, on the node itself (a tmux pane's
``while :; do python3 -m sglang.launch_server ...; sleep 1; done``), over SSH: the loop is
what the server is (its identity names each command it runs), so it is stopped with it and
first, also when the teardown finds it between two runs of the server."""

from __future__ import annotations

import time

import pytest
from simhelp import Cli
from slurmhelp import wait_for

from fleetclean.sim.launcher import FAKEPKGS, PROGRAMS

pytestmark = pytest.mark.sim

LOOP = "while :; do python3 -m sglang.launch_server --tp 2; sleep 1; done"


def test_a_shell_that_runs_the_server_in_a_loop_is_stopped_with_it(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)

    def sh(command: str) -> str:
        done = fleet.run_in("node01", ["sh", "-c", command])
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done.stdout.strip()

    def pids(pattern: str) -> list[int]:
        live = sh("ps -eo pid=,stat= | awk '$2 !~ /^Z/ {print $1}'").split()
        return [int(p) for p in sh(f"pgrep -f '{pattern}' || true").split() if p in live]

    sh(f"PYTHONPATH={FAKEPKGS} FLEETCLEAN_SIM_PROGRAMS={PROGRAMS} FLEETCLEAN_SIM_GPUS=2,3 "
       f"FLEETCLEAN_SIM_GPU_MIB=2048 setsid sh -c '{LOOP}' </dev/null >/dev/null 2>&1 &")
    assert wait_for(lambda: fleet.gpu_used_mib("node01")[2:4] == [2048, 2048])
    (shell,) = pids("^sh -c while")
    checked = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert (f"would send TERM to {shell} (sh -c {LOOP}) [code: sh -c :; python3 -m "
            "sglang.launch_server; sleep]") in checked.out, checked.out
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert (done.code, host["status"]) == (0, "clean"), host
    assert host["signalled"][0]["pid"] == shell  # the loop first: nothing starts it again
    time.sleep(3)  # the loop's `sleep 1` is long over: nothing came back
    assert pids("sglang") == [] and pids("^sh -c while") == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
