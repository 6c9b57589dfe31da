"""Inventories the way users have them: bare names resolved through an ssh_config."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from simhelp import Cli

pytestmark = pytest.mark.sim


def test_names_only_inventory_reaches_sim_nodes_through_ssh_config(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(3)
    fleet.spawn("node02", "sglang", gpus="0-1")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpus]\nnode[01:03]\n")

    listed = cli("inventory", "-i", inventory, "-F", fleet.ssh_config_path, "--json")
    assert listed.code == 0, listed.err
    by_name = {h["name"]: h for h in listed.json()["hosts"]}
    assert by_name["node02"]["address"] == fleet.node("node02").address
    assert by_name["node02"]["user"] == "root"

    res = cli("status", "-i", inventory, "-F", fleet.ssh_config_path, "-l", "gpus:!node03",
              "--json")
    assert res.code == 1, res.out  # node02's GPUs are held: dirty, read-only
    assert [h["host"] for h in res.json()["hosts"]] == ["node01", "node02"]
    assert res.host("node01")["status"] == "clean"
    used = [g["memory_used_mib"] for g in res.host("node02")["gpus"]]
    assert used == fleet.gpu_used_mib("node02") and used[0] > 0


def test_without_the_ssh_config_the_bare_names_do_not_resolve(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    sim_fleet_factory(1)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node01 ansible_connection=ssh\n")
    res = cli("status", "-i", inventory, "-F", "", "--connect-timeout", "2", "--json")
    assert res.code == 2
    assert res.host("node01")["status"] == "unreachable"


def test_hosts_behind_a_bastion_share_one_connection_to_it(
    sim_fleet_factory, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = sim_fleet_factory(4)
    # The bastion, named by address, is offered the user's own ~/.ssh/id_ed25519 (here the
    # fleet's key), as by ssh: never the inventory's key.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copyfile(fleet.client_key_path, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    bastion = fleet.node("node01")
    log = bastion.dir / "sshd.log"
    before = log.read_text().count("Accepted publickey")
    data = fleet.inventory_path.read_text()
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(data.replace(
        "ansible_ssh_common_args: ",
        f"ansible_ssh_common_args: -J root@{bastion.address} ",
    ))
    for name in ("node02", "node03", "node04"):
        fleet.spawn(name, "sglang", gpus="0")

    res = cli("run", "pre-restart", "-i", inventory, "-l", "node0[2-4]", "--json")

    assert res.code == 0, res.out
    assert res.json()["summary"]["clean"] == 3
    assert log.read_text().count("Accepted publickey") - before == 1
