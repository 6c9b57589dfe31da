"""Jump hosts the way users write them: ssh_config aliases, Ansible's -J, ProxyCommand.

Sim nodes are real sshds on loopback, so one node is a bastion for another: its sshd log
shows the login, and the host behind it is really cleaned.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from simhelp import Cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim


def logins(fleet: SimFleet, name: str) -> int:
    return (fleet.node(name).dir / "sshd.log").read_text().count("Accepted publickey")


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> SimFleet:
    fleet: SimFleet = module_fleet_factory(4)
    return fleet


def _config(fleet: SimFleet, tmp_path: Path, head: str) -> Path:
    """The sim's ssh_config with ``head`` in front (ssh takes the first value it finds)."""
    path = tmp_path / "ssh_config"
    path.write_text(head + "\n" + fleet.ssh_config_path.read_text())
    return path


def _keygen(path: Path) -> str:
    """A new Ed25519 key at ``path``; its public line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text()


def _fingerprint(public: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(public)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A $HOME of this test's own, and no agent: ~/.ssh is the test's."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def users_key(home: Path, key: Path) -> None:
    """``key`` as the user's own ~/.ssh/id_ed25519, which ssh offers a host (a jump host
    among them) that its config gives no IdentityFile."""
    shutil.copyfile(key, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "id_ed25519").chmod(0o600)


def _clean_run(cli: Cli, fleet: SimFleet, tmp_path: Path, *args: str) -> dict[str, object]:
    fleet.spawn("node04", "sglang", gpus="0-1")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node04\n")
    res = cli("run", "post-extraction", "-i", inventory, "-e", "grace=1", "--json", *args)
    assert "Traceback" not in res.err
    host = res.host("node04")
    assert (host["status"], host["error"]) == ("clean", None), res.out
    assert fleet.gpu_used_mib("node04") == [0] * 8
    return host


def test_two_hops_given_only_by_ssh_config_aliases(fleet: SimFleet, cli: Cli,
                                                    tmp_path: Path) -> None:
    # The jump itself comes through an Include and a Match block.
    (tmp_path / "hop.conf").write_text("Match host node04\n    ProxyJump node01,node02\n")
    config = _config(fleet, tmp_path, f"Include {tmp_path / 'hop.conf'}\n")
    before = {n: logins(fleet, n) for n in ("node01", "node02", "node03")}
    _clean_run(cli, fleet, tmp_path, "-F", str(config))
    after = {n: logins(fleet, n) for n in ("node01", "node02", "node03")}
    assert after["node01"] - before["node01"] == 1
    assert after["node02"] - before["node02"] == 1
    assert after["node03"] == before["node03"]


def test_two_hops_through_ansible_dash_j(fleet: SimFleet, cli: Cli, tmp_path: Path,
                                        own_home: Path) -> None:
    # Named by address, the jump hosts have no IdentityFile: ssh offers them the user's own
    # key, never the inventory's.
    users_key(own_home, fleet.client_key_path)
    a, b = fleet.node("node01").address, fleet.node("node02").address
    data = yaml.safe_load(fleet.inventory_path.read_text())
    data["all"]["vars"]["ansible_ssh_common_args"] += f" -J root@{a}:22,root@{b}"
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump(data))
    fleet.spawn("node04", "sglang", gpus="0")
    before = logins(fleet, "node01"), logins(fleet, "node02")
    res = cli("run", "post-extraction", "-i", inventory, "-l", "node04", "-e", "grace=1",
              "--json")
    assert res.host("node04")["status"] == "clean", res.out
    assert (logins(fleet, "node01") - before[0], logins(fleet, "node02") - before[1]) == (1, 1)
    assert fleet.gpu_used_mib("node04") == [0] * 8


def test_proxycommand_ssh_w(fleet: SimFleet, cli: Cli, tmp_path: Path) -> None:
    command = f"ssh -F {fleet.ssh_config_path} -W %h:%p node01"
    config = _config(fleet, tmp_path, f"Host node04\n    ProxyCommand {command}\n")
    before = logins(fleet, "node01")
    _clean_run(cli, fleet, tmp_path, "-F", str(config))
    assert logins(fleet, "node01") - before == 1


def test_a_bastions_own_proxycommand_reaches_it(fleet: SimFleet, cli: Cli,
                                               tmp_path: Path) -> None:
    # node04 through the bastion "jump" (node02), which ssh reaches through its own
    # ProxyCommand (via node01): was a direct TCP connection to node02, so a bastion
    # reachable only through a proxy was unreachable.
    command = f"ssh -F {fleet.ssh_config_path} -W %h:%p node01"
    node02 = fleet.node("node02")
    config = _config(fleet, tmp_path, f"Host node04\n    ProxyJump jump\nHost jump\n"
                     f"    HostName {node02.address}\n    ProxyCommand {command}\n"
                     f"    IdentityFile {fleet.client_key_path}\n")
    before = {n: logins(fleet, n) for n in ("node01", "node02")}
    _clean_run(cli, fleet, tmp_path, "-F", str(config))
    assert {n: logins(fleet, n) - before[n] for n in before} == {"node01": 1, "node02": 1}


def test_proxyjump_none_switches_off_an_inherited_jump(fleet: SimFleet, cli: Cli,
                                                       tmp_path: Path) -> None:
    # Every host would go through a dead bastion, except the one that says none.
    config = _config(fleet, tmp_path, "Host node04\n    ProxyJump none\n"
                     "Host *\n    ProxyJump root@127.0.0.1:1\n")
    _clean_run(cli, fleet, tmp_path, "-F", str(config))


def test_an_unknown_key_on_a_bastion_is_refused_with_its_fingerprint(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    node01 = fleet.node("node01")
    config = _config(fleet, tmp_path, f"Host node04\n    ProxyJump jump\nHost jump\n"
                     f"    HostName {node01.address}\n    UserKnownHostsFile {empty}\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node04\n")
    before = logins(fleet, "node01")
    res = cli("status", "-i", inventory, "-F", config, "--json")
    host = res.host("node04")
    printed = subprocess.run(["ssh-keygen", "-lf", str(node01.dir / "ssh_host_ed25519_key.pub")],
                             capture_output=True, text=True, check=True).stdout.split()[1]
    assert host["status"] == "host_key_mismatch"
    assert host["error"].startswith(f"bastion jump ({node01.address}:22): unknown host key")
    assert printed in host["error"]
    assert logins(fleet, "node01") == before, "nothing logged in to a bastion it cannot trust"
    assert empty.read_text() == "", "nothing recorded without --accept-new-host-keys"


def test_a_dead_second_hop_is_named_within_the_timeout(fleet: SimFleet, cli: Cli,
                                                       tmp_path: Path) -> None:
    config = _config(fleet, tmp_path, "Host node03 node04\n    ProxyJump node01,node02\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node03\nnode04\n")
    fleet.stop_node("node02")
    try:
        res = cli("status", "-i", inventory, "-F", config, "--connect-timeout", "2", "--json")
    finally:
        fleet.start_node("node02")
    address = fleet.node("node02").address
    for name in ("node03", "node04"):
        host = res.host(name)
        assert host["status"] == "unreachable"
        # paramiko keeps only the RFC 4254 reason code ("Connect failed") of the
        # channel-open failure, not sshd's own words ("Connection refused").
        assert host["error"] == (f"bastion node02 ({address}:22) unreachable: "
                                 "connect failed (from node01)")
    assert res.seconds < 2 + 8  # generous: shared CPU


def test_twenty_hosts_behind_one_bastion_open_one_connection_to_it(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(21)
    head = "Host * !node01\n    ProxyJump node01\n"
    config = _config(fleet, tmp_path, head)
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node[02:21]\n")
    before = logins(fleet, "node01")
    res = cli("status", "-i", inventory, "-F", config, "-f", "20", "--json")
    assert res.code == 0, res.out
    assert res.json()["summary"]["clean"] == 20
    assert logins(fleet, "node01") - before == 1


def test_a_bastion_is_offered_the_users_own_default_key_not_the_inventorys(
    fleet: SimFleet, cli: Cli, tmp_path: Path, own_home: Path
) -> None:
    # The common real case: the bastion takes the user's own ~/.ssh/id_ed25519, the nodes
    # the cluster key the inventory names. ssh's `ssh -W` for the jump host reads the
    # config for it and, with no IdentityFile there, offers ~/.ssh/id_*: fleetclean
    # offered the bastion the nodes' key, and the login was auth_failed.
    node01 = fleet.node("node01")
    authorized = node01.dir / "authorized_keys"
    kept = authorized.read_text()
    authorized.write_text(_keygen(own_home / ".ssh" / "id_ed25519"))
    config = _config(fleet, tmp_path, f"Host node04\n    ProxyJump jump\nHost jump\n"
                     f"    HostName {node01.address}\n    User root\n"
                     f"    UserKnownHostsFile {fleet.known_hosts_path}\n")
    log = node01.dir / "sshd.log"
    seen = len(log.read_text())
    try:
        _clean_run(cli, fleet, tmp_path, "-F", str(config))
        offered = log.read_text()[seen:]
        assert "Accepted publickey for root from" in offered
        assert _fingerprint(own_home / ".ssh" / "id_ed25519.pub") in offered
        # The nodes' key is never shown to the bastion, as by ssh.
        assert _fingerprint(fleet.client_key_path.with_suffix(".pub")) not in offered

        # The user's key gone: refused, and the error says what a jump host is offered.
        (own_home / ".ssh" / "id_ed25519").unlink()
        inventory = tmp_path / "hosts.ini"
        res = cli("status", "-i", inventory, "-F", config, "--json")
        host = res.host("node04")
        assert host["status"] == "auth_failed", host
        assert host["error"].startswith(f"bastion jump ({node01.address}:22): ")
        assert "a jump host is offered its own IdentityFile (Host jump in ssh_config)" in (
            host["error"])
    finally:
        authorized.write_text(kept)


@pytest.mark.parametrize("judged", ["UserKnownHostsFile {empty}", "HostKeyAlias elsewhere"])
def test_a_bastion_judged_apart_by_two_hosts_configs_is_not_shared(
    fleet: SimFleet, cli: Cli, tmp_path: Path, judged: str
) -> None:
    # Two hosts, each with its own -F file, behind the same bastion (same address, port,
    # user and key); one host's config trusts the bastion's key, the other's does not (no
    # key in its known_hosts, or another name to look it up by). The connection to the
    # bastion was shared by address, port, user and keys: whichever host connected first
    # decided for both, and the second was cleaned through a bastion its config refuses.
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    node01 = fleet.node("node01")
    jump = (f"Host node03 node04\n    ProxyJump jump\nHost jump\n    HostName {node01.address}\n"
            f"    User root\n    IdentityFile {fleet.client_key_path}\n    IdentitiesOnly yes\n"
            "    StrictHostKeyChecking yes\n")
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = _config(fleet, tmp_path / "good",
                   jump + f"    UserKnownHostsFile {fleet.known_hosts_path}\n")
    bad = _config(fleet, tmp_path / "bad", jump + "    " + judged.format(empty=empty) + "\n"
                  f"    UserKnownHostsFile {fleet.known_hosts_path}\n")
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "node03": {"ansible_ssh_common_args": f"-F {good}"},
        "node04": {"ansible_ssh_common_args": f"-F {bad}"}}}}))
    ssh = [subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", name, "true"],
                          capture_output=True, timeout=30, check=False,
                          stdin=subprocess.DEVNULL).returncode == 0
           for config, name in ((good, "node03"), (bad, "node04"))]
    assert ssh == [True, False]
    for order in ((), ("--forks", "1")):
        res = cli("status", "-i", inventory, "--json", *order)
        assert res.host("node03")["status"] == "clean", res.out
        host = res.host("node04")
        assert host["status"] == "host_key_mismatch", res.out
        assert host["error"].startswith(f"bastion jump ({node01.address}:22): unknown host key")
    assert empty.read_text() == ""


def test_a_jump_host_with_no_usable_key_is_told_what_it_is_offered(
    fleet: SimFleet, cli: Cli, tmp_path: Path, own_home: Path
) -> None:
    # No IdentityFile for the jump host, no ~/.ssh/id_*, no agent: the message named the
    # inventory's key (ansible_ssh_private_key_file), which a jump host is never offered.
    # An encrypted ~/.ssh/id_ed25519 with no agent said "Private key file is encrypted"
    # and nothing of what to do: ssh would ask for its passphrase; fleetclean asks none.
    node01 = fleet.node("node01")
    config = _config(fleet, tmp_path, f"Host node04\n    ProxyJump jump\nHost jump\n"
                     f"    HostName {node01.address}\n    User root\n"
                     f"    UserKnownHostsFile {fleet.known_hosts_path}\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node04\n")
    where = f"{node01.address}:22"
    host = cli("status", "-i", inventory, "-F", config, "--json").host("node04")
    assert (host["status"], host["error"]) == ("auth_failed", (
        f"bastion jump ({where}): no key to offer root@{where}: a jump host is offered its "
        "own IdentityFile (Host jump in ssh_config), else ~/.ssh/id_*, and the agent's keys "
        "(IdentityAgent, else $SSH_AUTH_SOCK), never the inventory's key: none is there"))

    key = own_home / ".ssh" / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)],
                   check=True)
    host = cli("status", "-i", inventory, "-F", config, "--json").host("node04")
    assert host["status"] == "auth_failed"
    assert host["error"].startswith(f"bastion jump ({where}): authentication failed"), host
    assert f"is encrypted: add it to your agent (ssh-add {key})" in host["error"], host
