"""A machine whose site settings are in ssh's system-wide files (a cluster's login node):
bare node names reach the nodes, and their host keys are known, as ``ssh node01`` finds."""

from __future__ import annotations

import base64
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
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


def test_any_listed_key_is_taken_and_with_no_user_file_nothing_is_new(
    sim_fleet_factory, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = sim_fleet_factory(2)
    home, system = tmp_path / "home", tmp_path / "etc-ssh"
    (home / ".ssh").mkdir(parents=True)
    system.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FLEETCLEAN_SSH_SYSTEM_DIR", str(system))
    # The site's file lags behind a reinstall (another key listed for node01); the user's
    # own file has the node's key, hashed (HashKnownHosts yes, Debian's default). ssh
    # takes the host, as a line lists the key it shows; fleetclean compared one key a
    # host and type, the site's, and called the key changed.
    address = fleet.node("node01").address
    site, mine = [], []
    for line in fleet.known_hosts_path.read_text().splitlines():
        names, kind, key = line.split()[:3]
        if address in names.split(","):
            site.append(f"{names} {kind} {stale_ed25519()}")
            mine.append(f"{paramiko.HostKeys.hash_host(address)} {kind} {key}")
        else:
            site.append(line)
    assert mine, "node01's key"
    (system / "ssh_known_hosts").write_text("\n".join(site) + "\n")
    (home / ".ssh" / "known_hosts").write_text("\n".join(mine) + "\n")
    inventory = tmp_path / "inv.yaml"
    common = f"-o UserKnownHostsFile={fleet.known_hosts_path}"
    inventory.write_text(fleet.inventory_path.read_text().replace(common, ""))
    res = cli("status", "-i", inventory, "--json")
    assert res.code == 0, res.out
    assert {h["status"] for h in res.json()["hosts"]} == {"clean"}

    # UserKnownHostsFile none: ssh records nothing, and so takes no key as new.
    (system / "ssh_known_hosts").unlink()
    before = (home / ".ssh" / "known_hosts").read_text()
    inventory.write_text(fleet.inventory_path.read_text().replace(
        common, "-o UserKnownHostsFile=none"))
    res = cli("status", "-i", inventory, "--accept-new-host-keys", "--json")
    assert res.code == 2, res.out
    for host in res.json()["hosts"]:
        assert host["status"] == "host_key_mismatch"
        assert "UserKnownHostsFile is none" in host["error"]
    assert (home / ".ssh" / "known_hosts").read_text() == before


def stale_ed25519() -> str:
    """A fresh Ed25519 public key in known_hosts' base64: the one a site file still lists."""
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    msg = paramiko.Message()
    msg.add_string("ssh-ed25519")
    msg.add_string(raw)
    return base64.b64encode(msg.asbytes()).decode()


def test_revoked_host_keys_refuses_the_key_it_lists(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    # RevokedHostKeys (ssh_config, or -o in the ssh arguments) was not read: a node whose
    # key the site revoked was logged in to as root, where ssh refuses it.
    fleet = sim_fleet_factory(2)
    address = fleet.node("node01").address
    revoked = tmp_path / "revoked_keys"
    revoked.write_text("".join(
        " ".join(line.split()[1:3]) + "\n"
        for line in fleet.known_hosts_path.read_text().splitlines()
        if address in line.split()[0].split(",")))
    inventory = tmp_path / "inv.yaml"
    strict = "-o StrictHostKeyChecking=yes"
    inventory.write_text(fleet.inventory_path.read_text().replace(
        strict, f"{strict} -o RevokedHostKeys={revoked}"))
    res = cli("status", "-i", inventory, "--json")
    assert res.host("node02")["status"] == "clean", res.out
    assert res.host("node01")["status"] == "host_key_mismatch"
    assert "revoked" in res.host("node01")["error"]
