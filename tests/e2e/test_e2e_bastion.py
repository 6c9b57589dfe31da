"""Many hosts behind one bastion whose sshd has OpenSSH's own limits.

The limits, as sshd applies them (checked here on the real sshd, not assumed):
``MaxStartups 10:30:100`` counts connections between accept and authentication and drops new
ones past it before the banner; ``MaxSessions 10`` counts shell/exec/subsystem channels per
connection, never a ``direct-tcpip`` channel through a jump host. So fleetclean's one
connection per hop chain carries every host behind the bastion whatever MaxSessions says,
while a ``ProxyCommand ssh -W`` per host is a new bastion connection each (paced below the
MaxStartups threshold), and a bastion whose MaxStartups is full drops fleetclean's own
connection until the others give up their slots (retried).

24 hosts at once keep CI lean; ``benchmarks/scale.py --bastion`` runs 256 behind one
bastion with OpenSSH's own limits.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.sim import SimFleet
from fleetclean.transport import pool

pytestmark = pytest.mark.sim

TARGETS = 24


def log(fleet: SimFleet, name: str) -> str:
    return (fleet.node(name).dir / "sshd.log").read_text(errors="replace")


def logins(fleet: SimFleet, name: str) -> int:
    return log(fleet, name).count("Accepted publickey")


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> SimFleet:
    fleet: SimFleet = module_fleet_factory(TARGETS + 1)
    return fleet


@pytest.fixture
def stock_bastion(fleet: SimFleet) -> Iterator[SimFleet]:
    """node01 with OpenSSH's own limits; the simulator's lifted ones back afterwards."""
    fleet.set_sshd_limits("node01")
    yield fleet
    fleet.set_sshd_limits("node01", "512", 512)


def _files(fleet: SimFleet, tmp_path: Path, head: str) -> tuple[Path, Path]:
    config = tmp_path / "ssh_config"
    config.write_text(head + "\n" + fleet.ssh_config_path.read_text())
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("".join(f"{n.name}\n" for n in fleet.nodes[1:]))
    return config, inventory


JUMP = "Host * !node01\n    ProxyJump node01\n"


def _all_clean(cli: Cli, config: Path, inventory: Path) -> None:
    res = cli("status", "-i", inventory, "-F", config, "-f", str(TARGETS), "--json")
    assert "Traceback" not in res.err
    failed = {h["host"]: h["error"] for h in res.json()["hosts"] if h["status"] != "clean"}
    assert not failed, failed
    assert res.code == 0


def test_hosts_behind_a_stock_bastion_share_one_connection(
    stock_bastion: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    fleet = stock_bastion
    config, inventory = _files(fleet, tmp_path, JUMP)
    before = logins(fleet, "node01")
    _all_clean(cli, config, inventory)
    assert logins(fleet, "node01") - before == 1


def test_channels_through_a_bastion_are_not_sessions(
    stock_bastion: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    # MaxSessions 0: sshd_config(5) "prevents all shell, login and subsystem sessions while
    # still permitting forwarding".
    fleet = stock_bastion
    fleet.set_sshd_limits("node01", max_sessions=0)
    config, inventory = _files(fleet, tmp_path, JUMP)
    _all_clean(cli, config, inventory)
    itself = cli("status", "-i", "node01,", "-F", config, "--json").host("node01")
    assert itself["status"] == "error"
    assert "refused a session channel" in itself["error"]


def test_a_proxycommand_per_host_is_paced_below_max_startups(
    stock_bastion: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    fleet = stock_bastion
    command = f"ssh -F {fleet.ssh_config_path} -W %h:%p node01"
    config, inventory = _files(fleet, tmp_path, f"Host * !node01\n    ProxyCommand {command}\n")
    before = logins(fleet, "node01")
    _all_clean(cli, config, inventory)
    assert logins(fleet, "node01") - before == TARGETS  # one bastion login per host


def test_a_full_bastion_connection_gets_a_second_one(
    stock_bastion: SimFleet, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if each of the bastion's connections had room for 8 forwarded channels (its sshd's
    # open files, or another server's channel cap): 24 hosts at once need more than one.
    monkeypatch.setattr(pool, "CHANNELS_PER_LANE", 8)
    fleet = stock_bastion
    config, inventory = _files(fleet, tmp_path, JUMP)
    before = logins(fleet, "node01")
    _all_clean(cli, config, inventory)
    assert 2 <= logins(fleet, "node01") - before <= pool.MAX_LANES


@contextmanager
def full_startups(fleet: SimFleet, name: str, slots: int) -> Iterator[None]:
    """Hold ``slots`` unauthenticated connections to ``name``'s sshd until it logs that it
    dropped another one past MaxStartups (or 30 s pass)."""
    address = fleet.node(name).address
    held = [socket.create_connection((address, 22), timeout=5) for _ in range(slots)]
    for sock in held:
        assert sock.recv(64).startswith(b"SSH-")  # accepted: counted as a startup
    seen = len(log(fleet, name).split("past MaxStartups"))

    def release_after_a_drop() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(log(fleet, name).split("past MaxStartups")) > seen:
                break
            time.sleep(0.05)
        for sock in held:
            sock.close()

    releaser = threading.Thread(target=release_after_a_drop)
    releaser.start()
    try:
        yield
    finally:
        releaser.join()


def test_a_bastion_at_max_startups_drops_fleetclean_then_lets_it_in(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    fleet.set_sshd_limits("node01", max_startups="2")
    try:
        config, inventory = _files(fleet, tmp_path, JUMP)
        drops = log(fleet, "node01").count("past MaxStartups")
        with full_startups(fleet, "node01", 2):
            _all_clean(cli, config, inventory)
        assert log(fleet, "node01").count("past MaxStartups") > drops
    finally:
        fleet.set_sshd_limits("node01", "512", 512)
