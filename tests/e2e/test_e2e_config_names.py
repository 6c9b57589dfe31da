"""The names ssh_config gives a login, as ``ssh`` uses them: ``HostKeyAlias`` (the name a
host's key is looked up and recorded by: a node behind a tunnel or a port forward, one whose
address changes) and ``Match user`` (judged with the inventory's user, as ``ssh -l``).
OpenSSH's own client, run on the same files, is the judge of what ssh does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim

ALIAS = "gpu-tunnel-7"


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> SimFleet:
    fleet: SimFleet = module_fleet_factory(2)
    return fleet


def host_key(fleet: SimFleet, name: str) -> str:
    """The node's host key as a known_hosts line's last two words."""
    return " ".join((fleet.node(name).dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def ssh_ok(config: Path, name: str, *args: str) -> bool:
    """Whether OpenSSH's client logs in to ``name`` with ``config``."""
    done = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", *args, name, "true"],
                          capture_output=True, text=True, timeout=30, check=False,
                          stdin=subprocess.DEVNULL)
    return done.returncode == 0


def _aliased(fleet: SimFleet, tmp_path: Path, known: str) -> tuple[Path, Path, Path]:
    """(inventory, config, known_hosts) of gpu07, which is node02 known as ALIAS (written
    in capitals: ssh takes it in lower case)."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(known)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu07\n  HostName {fleet.node('node02').address}\n  User root\n"
        f"  IdentityFile {fleet.client_key_path}\n  IdentitiesOnly yes\n"
        f"  HostKeyAlias {ALIAS.upper()}\n  UserKnownHostsFile {known_hosts}\n"
        "  StrictHostKeyChecking yes\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu07\n")
    return inventory, config, known_hosts


def test_a_host_key_known_by_its_alias(fleet: SimFleet, cli: Cli, tmp_path: Path) -> None:
    # known_hosts knows the node only by its HostKeyAlias: ssh looks the key up there;
    # fleetclean looked up the address and called the key unknown.
    inventory, config, _ = _aliased(fleet, tmp_path, f"{ALIAS} {host_key(fleet, 'node02')}\n")
    assert ssh_ok(config, "gpu07")
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu07")
    assert (host["status"], host["error"]) == ("clean", None)

    # Another key under the alias: changed, for ssh and for fleetclean, which names both.
    inventory, config, _ = _aliased(fleet, tmp_path, f"{ALIAS} {host_key(fleet, 'node01')}\n")
    assert not ssh_ok(config, "gpu07")
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu07")
    assert host["status"] == "host_key_mismatch"
    address = fleet.node("node02").address
    assert host["error"].startswith(f"host key for {address}:22 (HostKeyAlias {ALIAS}) CHANGED")
    assert f"remove the old key of {ALIAS} from known_hosts" in host["error"]


def test_a_new_key_is_recorded_under_the_alias(fleet: SimFleet, cli: Cli,
                                               tmp_path: Path) -> None:
    inventory, config, known_hosts = _aliased(fleet, tmp_path, "")
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu07")
    address = fleet.node("node02").address
    assert host["status"] == "host_key_mismatch"
    assert host["error"].startswith(f"unknown host key for {ALIAS} (HostKeyAlias of "
                                    f"{address}:22) (ssh-ed25519 SHA256:")
    assert known_hosts.read_text() == ""

    host = cli("status", "-i", inventory, "-F", config, "--accept-new-host-keys",
               "--json").host("gpu07")
    assert host["status"] == "clean", host
    assert known_hosts.read_text() == f"{ALIAS} {host_key(fleet, 'node02')}\n"
    assert ssh_ok(config, "gpu07"), "ssh takes what fleetclean recorded"
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu07")
    assert host["status"] == "clean"


def test_a_known_hosts_name_in_capitals_is_the_same_host(fleet: SimFleet, cli: Cli,
                                                        tmp_path: Path) -> None:
    # known_hosts written by hand, the alias in capitals: ssh matches host names in any
    # case (match.c match_hostname); fleetclean called the key unknown, and
    # --accept-new-host-keys appended a second line for it.
    line = f"{ALIAS.upper()} {host_key(fleet, 'node02')}\n"
    inventory, config, known_hosts = _aliased(fleet, tmp_path, line)
    assert ssh_ok(config, "gpu07")
    for extra in ((), ("--accept-new-host-keys",)):
        host = cli("status", "-i", inventory, "-F", config, "--json", *extra).host("gpu07")
        assert (host["status"], host["error"]) == ("clean", None)
    assert known_hosts.read_text() == line, "nothing recorded"
    # Another key under that name: changed, for both.
    line = f"{ALIAS.upper()} {host_key(fleet, 'node01')}\n"
    inventory, config, known_hosts = _aliased(fleet, tmp_path, line)
    assert not ssh_ok(config, "gpu07")
    host = cli("status", "-i", inventory, "-F", config, "--json",
               "--accept-new-host-keys").host("gpu07")
    assert host["status"] == "host_key_mismatch"
    assert "CHANGED" in host["error"], host["error"]
    assert known_hosts.read_text() == line, "nothing recorded"


def test_a_jump_hosts_key_known_by_its_alias(fleet: SimFleet, cli: Cli,
                                             tmp_path: Path) -> None:
    # The bastion's own HostKeyAlias: its `ssh -W` reads it for the bastion.
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"bastion.example {host_key(fleet, 'node01')}\n"
                           f"{fleet.node('node02').address} {host_key(fleet, 'node02')}\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu08\n  HostName {fleet.node('node02').address}\n  ProxyJump jump\n"
        f"Host jump\n  HostName {fleet.node('node01').address}\n  HostKeyAlias bastion.example\n"
        f"Host *\n  User root\n  IdentityFile {fleet.client_key_path}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu08\n")
    assert ssh_ok(config, "gpu08")
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu08")
    assert (host["status"], host["error"]) == ("clean", None)


def test_match_user_is_judged_with_the_inventorys_user(fleet: SimFleet, cli: Cli,
                                                       tmp_path: Path) -> None:
    # A site's ssh_config routes its service account: `Match user ops` gives the address
    # and the key. Ansible logs in as `ssh -o User=ops gpu-a`, and the block applies; with
    # the inventory's user left out of the judgement (the local user, root here), it did
    # not, and the name did not resolve.
    node = fleet.node("node01")
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host *\n  User nobody-here\n"
        f"Match user ops\n  HostName {node.address}\n  IdentityFile {fleet.client_key_path}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {fleet.known_hosts_path}\n"
        "  StrictHostKeyChecking yes\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu-a ansible_user=ops\n")
    assert ssh_ok(config, "gpu-a", "-l", "ops")
    log = node.dir / "sshd.log"
    seen = len(log.read_text())
    host = cli("status", "-i", inventory, "-F", config, "--json").host("gpu-a")
    assert (host["status"], host["error"]) == ("clean", None)
    assert "Accepted publickey for ops from" in log.read_text()[seen:]
