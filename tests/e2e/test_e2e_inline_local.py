"""Inline host lists over real SSH, and local mode run inside a simulated node.

Local mode runs the teardown on the machine fleetclean itself runs on. So that it can never
touch this real machine, those tests start fleetclean *inside* a simulated node: nsenter into
the node's PID, mount and UTS namespaces, where the only processes it can see or signal are
the node's own, and the hostname is the node's.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, alive, ssh_log_count

import fleetclean
from fleetclean.sim import SimFleet
from fleetclean.sim.layout import node_python
from fleetclean.sim.node import node_env

pytestmark = pytest.mark.sim


def node_interpreter() -> tuple[str, str]:
    """The Python that runs fleetclean inside a node, and its PYTHONPATH.

    A node covers root's home (where a pyenv or a venv's base interpreter may live), so the
    controller runs on the node's interpreter with this checkout and this environment's
    packages on its path; they must be built for the same Python version."""
    python = node_python()
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"{python} is Python {version}; the packages here are for another")
    paths = [str(Path(fleetclean.__file__).resolve().parents[1]), *site.getsitepackages()]
    return python, os.pathsep.join(paths)


def fleetclean_in_node(fleet: SimFleet, node: str, *argv: str) -> tuple[int, Any, str]:
    """Run the CLI inside ``node``'s namespaces (no SSH): exit status, --json, stderr."""
    python, path = node_interpreter()
    init = fleet.node(node).init_pid
    done = subprocess.run(
        ["nsenter", "-t", str(init), "-p", "-m", "-u", "--",
         python, "-m", "fleetclean", *argv, "--json"],
        capture_output=True, text=True, env={**node_env(), "PYTHONPATH": path}, timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout else None, done.stderr


def test_a_host_list_with_ranges_reaches_nodes_through_ssh_config(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(3)
    fleet.spawn("node02", "sglang", gpus="0-1")

    res = cli("status", "-i", "node[01:03],", "-F", fleet.ssh_config_path, "--json")

    assert res.code == 1, res.err  # node02's GPUs are held: dirty, read-only
    assert [h["host"] for h in res.json()["hosts"]] == ["node01", "node02", "node03"]
    assert res.host("node01")["status"] == "clean"
    used = [g["memory_used_mib"] for g in res.host("node02")["gpus"]]
    assert used == fleet.gpu_used_mib("node02") and used[0] > 0


def test_single_host_lists_given_twice_clean_exactly_those_hosts(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(3)
    servers = {name: fleet.spawn(name, "sglang", gpus="0") for name in ("node01", "node02",
                                                                        "node03")}

    res = cli("run", "pre-restart", "-i", "node01,", "-i", "node03,",
              "-F", fleet.ssh_config_path, "--json")

    assert res.code == 0, res.err + res.out
    assert [h["host"] for h in res.json()["hosts"]] == ["node01", "node03"]
    assert alive(fleet, "node01", servers["node01"]) == []
    assert alive(fleet, "node03", servers["node03"]) == []
    assert alive(fleet, "node02", servers["node02"]) == servers["node02"], "not selected"


def test_status_local_reads_this_machine_without_ssh(sim_fleet_factory) -> None:
    fleet = sim_fleet_factory(1)
    fleet.spawn("node01", "sglang", gpus="2-3")
    connections = ssh_log_count(fleet)

    code, out, err = fleetclean_in_node(fleet, "node01", "status", "--local")

    assert code == 1, err  # GPUs 2 and 3 are held
    [host] = out["hosts"]
    assert host["host"] == "node01", "named after the machine's own hostname"
    used = [g["memory_used_mib"] for g in host["gpus"]]
    assert used == fleet.gpu_used_mib("node01") and used[2] > 0 and used[0] == 0
    assert ssh_log_count(fleet) == connections, "local mode opens no SSH connection"


def test_run_local_cleans_this_machine_only(sim_fleet_factory) -> None:
    fleet = sim_fleet_factory(2)
    here = fleet.spawn("node01", "sglang")
    monitor = fleet.spawn("node01", "monitor")
    elsewhere = fleet.spawn("node02", "sglang", gpus="0")

    code, out, err = fleetclean_in_node(fleet, "node01", "run", "pre-restart", "--local",
                                        "--no-record")

    assert code == 0, err
    assert out["hosts"][0]["status"] == "clean"
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert alive(fleet, "node01", here) == []
    assert alive(fleet, "node01", monitor) == monitor, "a protected process lives on"
    assert alive(fleet, "node02", elsewhere) == elsewhere, "another machine is untouched"


def test_connection_local_runs_an_inline_host_here(sim_fleet_factory) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang", gpus="0-3")
    connections = ssh_log_count(fleet)

    code, out, err = fleetclean_in_node(fleet, "node01", "run", "pre-restart",
                                        "-i", "node01,", "-c", "local", "--no-record")

    assert code == 0, err
    assert [(h["host"], h["status"]) for h in out["hosts"]] == [("node01", "clean")]
    assert alive(fleet, "node01", server) == []
    assert ssh_log_count(fleet) == connections
