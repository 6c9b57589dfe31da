"""``-i slurm:`` against the simulated fleet's real Slurm, over real SSH."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from simhelp import Cli, down_checked, module_subnet
from slurmhelp import needs_slurm, node_idle, slurm_cmd, wait_for

from fleetclean.sim import SimFleet

pytestmark = [pytest.mark.sim, pytest.mark.slurm, needs_slurm]


@pytest.fixture(scope="module")
def slurm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    fleet = SimFleet.up(3, tmp_path_factory.mktemp("slurminv"), subnet=module_subnet(), slurm=True)
    try:
        yield fleet
    finally:
        down_checked(fleet)


def test_partition_and_state_limits_pick_the_idle_gpu_nodes(
    slurm_fleet: SimFleet, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_fleet.slurm_conf_path))
    drain = slurm_cmd(slurm_fleet, "scontrol", "update", "NodeName=node02", "State=DRAIN",
                      "Reason=test")
    assert drain.returncode == 0, drain.stderr
    try:
        result = cli("status", "-i", "slurm:", "-F", slurm_fleet.ssh_config_path,
                     "-l", "partition_gpu:&state_idle", "--json")
        assert result.code == 0, result.err
        assert [h["host"] for h in result.json()["hosts"]] == ["node01", "node03"]
        assert all(h["status"] == "clean" for h in result.json()["hosts"])
        debug = cli("status", "-i", "slurm:", "-F", slurm_fleet.ssh_config_path,
                    "-l", "partition_debug", "--json")
        assert [h["host"] for h in debug.json()["hosts"]] == ["node01"]
    finally:
        slurm_cmd(slurm_fleet, "scontrol", "update", "NodeName=node02", "State=RESUME")
    assert wait_for(lambda: node_idle(slurm_fleet, "node02"))


def test_the_sim_inventory_given_as_well_supplies_the_ssh_settings(
    slurm_fleet: SimFleet, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_fleet.slurm_conf_path))
    result = cli("inventory", "-i", slurm_fleet.inventory_path, "-i", "slurm:", "-F", "",
                 "-l", "state_idle:&partition_debug", "--json")
    assert result.code == 0, result.err
    (host,) = result.json()["hosts"]
    assert (host["name"], host["address"]) == ("node01", slurm_fleet.node("node01").address)
    assert {"partition_gpu", "partition_debug", "state_idle", "slurm"} <= set(host["groups"])
