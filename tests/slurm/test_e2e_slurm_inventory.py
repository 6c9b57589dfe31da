"""``-i slurm:`` against the simulated fleet's real Slurm, over real SSH."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from simhelp import Cli, down_checked, module_subnet, ssh_log_count
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


def test_a_login_node_lists_the_nodes_over_ssh_with_the_same_groups(
    slurm_fleet: SimFleet, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No SLURM_CONF here: sinfo runs on the login node (node01, whose /etc/slurm is the
    # fleet's), reached through the sim's ssh_config like any host.
    monkeypatch.delenv("SLURM_CONF", raising=False)
    remote = cli("inventory", "-i", "slurm://node01", "-F", slurm_fleet.ssh_config_path,
                 "--json")
    assert remote.code == 0, remote.err
    monkeypatch.setenv("SLURM_CONF", str(slurm_fleet.slurm_conf_path))
    local = cli("inventory", "-i", "slurm:", "-F", slurm_fleet.ssh_config_path, "--json")
    assert remote.json() == local.json()
    status = cli("status", "-i", "slurm://root@node01:22", "-F", slurm_fleet.ssh_config_path,
                 "-l", "partition_debug:&state_idle", "--json")
    assert status.code == 0, status.err
    assert [h["host"] for h in status.json()["hosts"]] == ["node01"]


def test_a_login_node_with_an_unknown_host_key_is_refused_before_any_node_is_reached(
    slurm_fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    login = slurm_fleet.node("node01")
    config = tmp_path / "ssh_config"
    known = tmp_path / "known_hosts"
    # The login node under another name, its key unknown; the nodes as the sim writes them
    # (included first: an Include after "Host login" would apply to the login alone, as ssh
    # reads it).
    config.write_text(
        f"Include {slurm_fleet.ssh_config_path}\n\n"
        f"Host login\n  HostName {login.address}\n  User root\n"
        f"  IdentityFile {slurm_fleet.client_key_path}\n  UserKnownHostsFile {known}\n"
    )
    before = ssh_log_count(slurm_fleet, "Accepted publickey")
    refused = cli("status", "-i", "slurm://login", "-F", config)
    assert refused.code == 4
    assert refused.err.count("\n") == 1
    assert "-i 'slurm://login': sinfo on login:" in refused.err
    assert "SHA256:" in refused.err  # the fingerprint to check, as for any host
    assert ssh_log_count(slurm_fleet, "Accepted publickey") == before
    # Recorded once asked to, like any host's, and then the nodes are read through it.
    accepted = cli("status", "-i", "slurm://login", "-F", config, "--accept-new-host-keys",
                   "-l", "partition_debug", "--json")
    assert accepted.code == 0, accepted.err
    assert [h["host"] for h in accepted.json()["hosts"]] == ["node01"]
    assert login.address in known.read_text()
