"""A site with an SSH certificate authority: every node's sshd shows a HostCertificate its
CA signed (real ``ssh-keygen -s -h``), and known_hosts holds one ``@cert-authority`` line,
no node's key. ``ssh node07`` works there; fleetclean must too, and refuse what ssh refuses
(a wrong principal, an expired certificate, another CA's, a revoked key), whatever
``--accept-new-host-keys`` says.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fabric import Connection
from simhelp import Cli

from fleetclean import api
from fleetclean.models import HostStatus
from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim


def logins(fleet: SimFleet, name: str) -> int:
    return (fleet.node(name).dir / "sshd.log").read_text().count("Accepted publickey")


def ssh_ok(fleet: SimFleet, name: str, known: Path | None = None) -> bool:
    """What OpenSSH's own client says of the node's host key."""
    extra = ["-o", f"UserKnownHostsFile={known}"] if known else []
    done = subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), *extra, name, "true"],
                          capture_output=True, text=True, timeout=30, check=False)
    return done.returncode == 0


def aliased(fleet: SimFleet, tmp_path: Path, alias: str) -> tuple[Path, Path, Path, str]:
    """An ssh_config that names node01 ``gpu07``, with ``HostKeyAlias ALIAS`` and a
    known_hosts of its own (not yet written), and an inventory of gpu07: the config, the
    known_hosts, the inventory and the host CA's public key."""
    ca = fleet.host_ca_path
    assert ca is not None
    known = tmp_path / "known_hosts"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu07\n  HostName {fleet.node('node01').address}\n  User root\n"
        f"  HostKeyAlias {alias}\n"
        f"  IdentityFile {fleet.client_key_path}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu07\n")
    return config, known, inventory, ca.with_suffix(".pub").read_text()


def test_a_ca_vouched_fleet_and_the_certificates_ssh_refuses(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    fleet: SimFleet = sim_fleet_factory(5, host_ca=True)
    known = fleet.known_hosts_path.read_text()
    assert known.startswith("@cert-authority ") and len(known.splitlines()) == 1

    res = cli("status", "-i", fleet.inventory_path, "--json")
    assert res.code == 0, res.out
    assert {h["status"] for h in res.json()["hosts"]} == {"clean"}
    assert ssh_ok(fleet, "node01")

    other_ca = tmp_path / "other_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_ca)],
                   check=True)
    fleet.certify_host_key("node01", principals=("node01.elsewhere.example",))
    fleet.certify_host_key("node02", validity="20200101:20200102")
    fleet.certify_host_key("node03", ca=other_ca)
    # node04's certificate is good, but its key is revoked in the user's own file.
    revoked = tmp_path / "known_hosts"
    key = (fleet.node("node04").dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    revoked.write_text(f"@revoked * {' '.join(key)}\n" + known)
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(fleet.inventory_path.read_text().replace(
        str(fleet.known_hosts_path), str(revoked)))
    before = {n.name: logins(fleet, n.name) for n in fleet.nodes}
    kept = revoked.read_text()

    for extra in ((), ("--accept-new-host-keys",)):
        res = cli("status", "-i", inventory, "--json", *extra)
        assert res.code == 2, res.out
        status = {h["host"]: h["status"] for h in res.json()["hosts"]}
        assert status == {"node01": "host_key_mismatch", "node02": "host_key_mismatch",
                          "node03": "host_key_mismatch", "node04": "host_key_mismatch",
                          "node05": "clean"}, res.out
        address = fleet.node("node01").address
        assert res.host("node01")["error"] == (
            f"{address}:22: host certificate refused: {address} is not among its principals "
            "(node01.elsewhere.example; compared exactly); nothing was run")
        assert "host certificate refused: it expired (valid from 2020-01-01" in (
            res.host("node02")["error"])
        assert "host certificate refused: it is signed by a CA not trusted for" in (
            res.host("node03")["error"])
        assert "is @revoked" in res.host("node04")["error"]
    assert revoked.read_text() == kept, "nothing recorded"
    after = {n.name: logins(fleet, n.name) for n in fleet.nodes}
    assert {n: after[n] - before[n] for n in after} == {
        "node01": 0, "node02": 0, "node03": 0, "node04": 0, "node05": 2}
    # OpenSSH's own client refuses the same four.
    assert [ssh_ok(fleet, f"node0{i}", revoked) for i in range(1, 6)] == [
        False, False, False, False, True]


def test_a_jump_host_is_judged_by_its_certificate_too(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    fleet: SimFleet = sim_fleet_factory(3, host_ca=True)
    config = tmp_path / "ssh_config"
    config.write_text("Host node03\n    ProxyJump node01\n\n" + fleet.ssh_config_path.read_text())
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node03\n")
    before = logins(fleet, "node01"), logins(fleet, "node03")
    res = cli("status", "-i", inventory, "-F", config, "--json")
    assert res.host("node03")["status"] == "clean", res.out
    assert (logins(fleet, "node01") - before[0], logins(fleet, "node03") - before[1]) == (1, 1)

    fleet.certify_host_key("node01", validity="20200101:20200102")
    before = logins(fleet, "node01"), logins(fleet, "node03")
    for extra in ((), ("--accept-new-host-keys",)):
        res = cli("status", "-i", inventory, "-F", config, "--json", *extra)
        host = res.host("node03")
        address = fleet.node("node01").address
        assert host["status"] == "host_key_mismatch", res.out
        assert host["error"].startswith(
            f"bastion node01 ({address}:22): {address}:22: host certificate refused: "
            "it expired"), host["error"]
    assert (logins(fleet, "node01"), logins(fleet, "node03")) == before
    assert fleet.known_hosts_path.read_text().startswith("@cert-authority ")
    assert len(fleet.known_hosts_path.read_text().splitlines()) == 1


def test_the_library_takes_a_certificate_on_a_callers_own_connections(
    sim_fleet_factory,
) -> None:
    fleet: SimFleet = sim_fleet_factory(2, host_ca=True)
    fleet.certify_host_key("node02", principals=("someone.else",))
    key = {"key_filename": str(fleet.client_key_path)}
    conns = [Connection(n.address, user="root", connect_kwargs=dict(key)) for n in fleet.nodes]
    result = api.status(conns, known_hosts=[str(fleet.known_hosts_path)],
                        accept_new_host_keys=True)
    assert [h.status for h in result.hosts] == [HostStatus.CLEAN,
                                                HostStatus.HOST_KEY_MISMATCH]
    assert "is not among its principals (someone.else;" in (result.hosts[1].error or "")
    assert len(fleet.known_hosts_path.read_text().splitlines()) == 1


def test_a_certificate_names_the_host_by_its_alias(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    # A node reached through a port forward or a tunnel, whose certificate names it by the
    # HostKeyAlias users give it: ssh checks the principals (and finds the @cert-authority
    # line) by the alias, not by the address it connected to.
    fleet: SimFleet = sim_fleet_factory(1, host_ca=True)
    node = fleet.node("node01")
    config, known, inventory, ca_key = aliased(fleet, tmp_path, "gpu-tunnel-7")
    known.write_text(f"@cert-authority gpu-tunnel-* {ca_key}")

    fleet.certify_host_key("node01", principals=("gpu-tunnel-7",))
    res = cli("status", "-i", inventory, "-F", config, "--json", "--accept-new-host-keys")
    assert (res.host("gpu07")["status"], res.host("gpu07")["error"]) == ("clean", None)
    assert subprocess.run(["ssh", "-F", str(config), "gpu07", "true"], capture_output=True,
                          timeout=30, check=False).returncode == 0

    # Its name and address, not the alias: refused by both, nothing recorded.
    fleet.certify_host_key("node01")
    res = cli("status", "-i", inventory, "-F", config, "--json", "--accept-new-host-keys")
    host = res.host("gpu07")
    assert host["status"] == "host_key_mismatch"
    assert host["error"] == (
        f"{node.address}:22 (HostKeyAlias gpu-tunnel-7): host certificate refused: "
        f"gpu-tunnel-7 is not among its principals (node01, {node.address}; compared "
        "exactly); nothing was run")
    assert subprocess.run(["ssh", "-F", str(config), "gpu07", "true"], capture_output=True,
                          timeout=30, check=False).returncode != 0
    assert len(known.read_text().splitlines()) == 1


def test_a_bracketed_alias_is_one_name_never_split_from_its_port(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    # An alias written with a port, `HostKeyAlias [GPU-Tunnel-7]:2222`: ssh looks the host
    # up, matches @cert-authority patterns and checks the principals by that one name (in
    # lower case), never again without the port as for a host on another port with no alias
    # (sshconnect.c check_host_key). A CA line for `gpu-tunnel-7`, or a certificate naming
    # `gpu-tunnel-7`, does not vouch for it.
    fleet: SimFleet = sim_fleet_factory(1, host_ca=True)
    node = fleet.node("node01")
    config, known, inventory, ca_key = aliased(fleet, tmp_path, "[GPU-Tunnel-7]:2222")

    def both(*extra: str) -> tuple[str, str | None, bool]:
        res = cli("status", "-i", inventory, "-F", config, "--json", *extra)
        done = subprocess.run(["ssh", "-F", str(config), "gpu07", "true"],
                              capture_output=True, text=True, timeout=30, check=False)
        host = res.host("gpu07")
        return host["status"], host["error"], done.returncode == 0

    where = f"{node.address}:22 (HostKeyAlias [gpu-tunnel-7]:2222)"
    # The certificate names the alias without its port; the CA line is for every host:
    # refused (ssh: "Certificate invalid: name is not a listed principal"), never new.
    fleet.certify_host_key("node01", principals=("gpu-tunnel-7",))
    known.write_text(f"@cert-authority * {ca_key}")
    assert both("--accept-new-host-keys") == ("host_key_mismatch", (
        f"{where}: host certificate refused: [gpu-tunnel-7]:2222 is not among its "
        "principals (gpu-tunnel-7; compared exactly); nothing was run"), False)
    assert len(known.read_text().splitlines()) == 1, "nothing recorded"
    # The CA line names the alias without its port: it vouches for no key of this host,
    # whose key is unknown (a new host's, which ssh takes only as new, as fleetclean).
    fleet.certify_host_key("node01", principals=("[gpu-tunnel-7]:2222",))
    known.write_text(f"@cert-authority gpu-tunnel-7 {ca_key}")
    status, error, ssh = both()
    assert (status, ssh) == ("host_key_mismatch", False)
    assert error is not None and error.startswith(
        "unknown host key for [gpu-tunnel-7]:2222 (HostKeyAlias of "), error
    # The alias as written, in the CA line and the certificate: clean, for both.
    known.write_text(f"@cert-authority [gpu-tunnel-7]:2222 {ca_key}")
    assert both() == ("clean", None, True)
    assert len(known.read_text().splitlines()) == 1
