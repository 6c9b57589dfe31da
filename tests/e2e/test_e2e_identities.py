"""A host reached as ssh reaches it when its key is not the first one named: ssh tries every
identity file, and takes -i, -o HostName from ansible_ssh_common_args. Real sshds: a key they
refuse is really refused, and the host is really read."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from simhelp import Cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> SimFleet:
    fleet: SimFleet = module_fleet_factory(2)
    return fleet


@pytest.fixture(scope="module")
def stranger_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A key no simulated node accepts."""
    path = tmp_path_factory.mktemp("keys") / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _with_keys(fleet: SimFleet, tmp_path: Path, key: Path, args: str) -> Path:
    """An INI inventory of node01 with ``key`` and ``args`` (IdentitiesOnly) for ssh."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"node01 ansible_host={fleet.node('node01').address} ansible_user=root "
        f"ansible_ssh_private_key_file={key} "
        f"ansible_ssh_common_args='-o UserKnownHostsFile={fleet.known_hosts_path} "
        f"-o IdentitiesOnly=yes {args}'\n")
    return inventory


def _with_config(fleet: SimFleet, tmp_path: Path, *keys: Path) -> tuple[Path, Path]:
    """(inventory, ssh config) of node01, the config naming ``keys`` as IdentityFiles."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host node01\n  HostName {fleet.node('node01').address}\n  User root\n"
        + "".join(f"  IdentityFile {k}\n" for k in keys)
        + f"  IdentitiesOnly yes\n  UserKnownHostsFile {fleet.known_hosts_path}\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node01\n")
    return inventory, config


def _status(cli: Cli, inventory: Path, *args: str) -> dict[str, object]:
    res = cli("status", "-i", inventory, "--json", *args)
    assert "Traceback" not in res.err
    host: dict[str, object] = res.host("node01")
    return host


def test_the_second_identity_file_of_the_config_is_tried(fleet: SimFleet, cli: Cli,
                                                         stranger_key: Path,
                                                         tmp_path: Path) -> None:
    node = fleet.node("node01")
    inventory, config = _with_config(fleet, tmp_path, stranger_key, fleet.client_key_path)
    host = _status(cli, inventory, "-F", str(config))
    assert (host["status"], host["error"]) == ("clean", None)
    # The stranger key was offered first and refused by the node's real sshd.
    log = (node.dir / "sshd.log").read_text()
    assert "Accepted publickey" in log


def test_identity_and_hostname_from_ansible_ssh_common_args(fleet: SimFleet, cli: Cli,
                                                            stranger_key: Path,
                                                            tmp_path: Path) -> None:
    # Neither the inventory's key (refused) nor its name (no such host) reaches the node:
    # -i and -o HostName in the ssh arguments do, as they do for ssh.
    node = fleet.node("node01")
    data = {"all": {"hosts": {"node01": {
        "ansible_host": "no-such-host.invalid",
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(stranger_key),
        "ansible_ssh_common_args": (
            f"-o UserKnownHostsFile={fleet.known_hosts_path} -o StrictHostKeyChecking=yes "
            f"-i {fleet.client_key_path} -o HostName={node.address}"),
    }}}}
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump(data))
    host = _status(cli, inventory)
    assert (host["status"], host["error"]) == ("clean", None)


def test_only_a_refused_key_is_auth_failed(fleet: SimFleet, cli: Cli, stranger_key: Path,
                                          tmp_path: Path) -> None:
    # Every key tried and refused: still auth_failed, naming the first.
    host = _status(cli, _with_keys(fleet, tmp_path, stranger_key, ""))
    assert host["status"] == "auth_failed"
    assert str(stranger_key) in str(host["error"])


def test_too_many_refused_keys_are_auth_failed(fleet: SimFleet, cli: Cli,
                                               tmp_path_factory: pytest.TempPathFactory,
                                               tmp_path: Path) -> None:
    # Seven keys the node refuses: its sshd ends the login at MaxAuthTries (6), saying
    # "Too many authentication failures". A refusal, not a dropped connection or an error
    # ("No existing session", paramiko's word for the key it could no longer offer).
    keys = tmp_path_factory.mktemp("seven")
    for i in range(7):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / f"k{i}")],
                       check=True)
    extra = " ".join(f"-i {keys / f'k{i}'}" for i in range(1, 7))
    host = _status(cli, _with_keys(fleet, tmp_path, keys / "k0", extra))
    assert host["status"] == "auth_failed", host
    assert "Too many authentication failures" in str(host["error"])


def test_a_missing_identity_file_is_skipped_as_ssh_skips_it(fleet: SimFleet, cli: Cli,
                                                            tmp_path: Path) -> None:
    inventory, config = _with_config(fleet, tmp_path, tmp_path / "no_such_key",
                                     fleet.client_key_path)
    host = _status(cli, inventory, "-F", str(config))
    assert (host["status"], host["error"]) == ("clean", None)


def test_a_refused_rsa_key_after_another_is_auth_failed(fleet: SimFleet, cli: Cli,
                                                       stranger_key: Path,
                                                       tmp_path: Path) -> None:
    # paramiko reads a key file as RSA, ECDSA and Ed25519 in turn and raises the last
    # error: a refused RSA key ended as "error: Invalid key" (the Ed25519 parser's words).
    rsa = tmp_path / "stranger_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)],
                   check=True)
    host = _status(cli, _with_keys(fleet, tmp_path, stranger_key, f"-i {rsa}"))
    assert host["status"] == "auth_failed", host
    assert "2 key(s) refused" in str(host["error"])


def test_an_rsa_key_logs_in_after_a_refused_one(fleet: SimFleet, cli: Cli,
                                                stranger_key: Path, tmp_path: Path) -> None:
    # Each key's signed request goes with the request for the authentication service
    # (transport/upstream.py: _KeyWithService), an RSA key's once the server has named its
    # signature algorithms: rsa-sha2-*, never the SHA-1 ssh-rsa that OpenSSH 8.8+ refuses.
    rsa = tmp_path / "accepted_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(rsa)],
                   check=True)
    fingerprint = subprocess.run(["ssh-keygen", "-lf", f"{rsa}.pub"], capture_output=True,
                                 text=True, check=True).stdout.split()[1]
    authorized = fleet.node("node01").dir / "authorized_keys"
    log = fleet.node("node01").dir / "sshd.log"
    before, seen = authorized.read_text(), log.stat().st_size
    authorized.write_text(before + Path(f"{rsa}.pub").read_text())
    try:
        host = _status(cli, _with_keys(fleet, tmp_path, stranger_key, f"-i {rsa}"))
    finally:
        authorized.write_text(before)  # the module's fleet, as the other tests have it
    assert (host["status"], host["error"]) == ("clean", None), host
    with log.open() as f:
        f.seek(seen)
        said = f.read()
    assert re.search(rf"Accepted publickey for root .* ssh2: RSA {re.escape(fingerprint)}$",
                     said, re.M), said[-2000:]
