"""A machine whose site settings are in ssh's system-wide files (a cluster's login node):
bare node names reach the nodes, and their host keys are known, as ``ssh node01`` finds."""

from __future__ import annotations

from pathlib import Path

import pytest
from simhelp import Cli

pytestmark = pytest.mark.sim


def test_site_config_and_host_keys_in_etc_ssh_reach_the_nodes(
    sim_fleet_factory, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = sim_fleet_factory(2)
    fleet.spawn("node02", "sglang", gpus="0-1")
    home, system = tmp_path / "home", tmp_path / "etc-ssh"
    (home / ".ssh").mkdir(parents=True)
    system.mkdir()
    monkeypatch.setenv("HOME", str(home))  # no ~/.ssh/config, an empty ~/.ssh
    monkeypatch.setenv("FLEETCLEAN_SSH_SYSTEM_DIR", str(system))
    monkeypatch.delenv("FLEETCLEAN_SSH_CONFIG", raising=False)
    # The site's config names each node's address, user and key, and no known_hosts file:
    # the keys are where the site puts them for every user.
    site = [line for line in fleet.ssh_config_path.read_text().splitlines()
            if "UserKnownHostsFile" not in line]
    (system / "ssh_config").write_text("\n".join(site) + "\n")
    (system / "ssh_known_hosts").write_text(fleet.known_hosts_path.read_text())
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpus]\nnode01\nnode02\n")

    res = cli("status", "-i", inventory, "--json")
    assert res.code == 1, res.err  # node02's GPUs are held: dirty
    assert res.host("node01")["status"] == "clean"
    used = [g["memory_used_mib"] for g in res.host("node02")["gpus"]]
    assert used == fleet.gpu_used_mib("node02") and used[0] > 0
    assert not (home / ".ssh" / "known_hosts").exists()  # nothing was new to record

    # Without the site's host keys the same nodes are unknown, and nothing runs there.
    (system / "ssh_known_hosts").unlink()
    res = cli("status", "-i", inventory, "--json")
    assert res.code != 0
    for name in ("node01", "node02"):
        assert res.host(name)["status"] == "host_key_mismatch"
        assert "unknown host key" in res.host(name)["error"]
