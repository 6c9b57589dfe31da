"""A laptop whose key lives in another agent than $SSH_AUTH_SOCK's (1Password's, Secretive's,
gpg-agent's), named by ``IdentityAgent`` in the ssh config: fleetclean logs in with it, as
``ssh`` does."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    """A real ssh-agent of this test's on its own socket, stopped by its PID."""
    sock = tmp_path / "vault" / "agent.sock"
    sock.parent.mkdir()
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def agent_holds_the_key(fleet: SimFleet, agent: Path, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fleet's key added to ``agent``, and a $HOME of the test's own with an empty
    ~/.ssh (no key file of its own to fall back on): that home."""
    added = subprocess.run(["ssh-add", str(fleet.client_key_path)], capture_output=True,
                           env={**os.environ, "SSH_AUTH_SOCK": str(agent)}, check=False)
    assert added.returncode == 0, added.stderr
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    return home


def test_the_agent_identityagent_names_is_the_one_asked(
    sim_fleet_factory, cli: Cli, tmp_path: Path, agent: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = sim_fleet_factory(1)
    home = agent_holds_the_key(fleet, agent, tmp_path, monkeypatch)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-agent-here.sock"))
    monkeypatch.setenv("VAULT_AGENT", str(agent))
    node = fleet.node("node01")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node01\n")
    config = tmp_path / "ssh_config"

    def status(identity_agent: str) -> dict[str, object]:
        config.write_text(
            f"Host node01\n  HostName {node.address}\n  User root\n"
            f"  UserKnownHostsFile {fleet.known_hosts_path}\n"
            f"  IdentityAgent {identity_agent}\n")
        res = cli("status", "-i", inventory, "-F", config, "--connect-timeout", "5", "--json")
        return res.host("node01")

    # The socket itself, the "$VAR" and "${VAR}" forms, "~" and the "%d" token (the home
    # directory, as 1Password's and gpg-agent's documented lines have it) all reach it.
    (home / "vault").symlink_to(agent.parent)
    for form in (str(agent), "$VAULT_AGENT", "${VAULT_AGENT}", "~/vault/agent.sock",
                 "%d/vault/agent.sock"):
        host = status(form)
        assert host["status"] == "clean", (form, host)
    # An agent that is not there: the login fails saying so, not as a refused key.
    host = status(str(tmp_path / "gone.sock"))
    assert host["status"] == "auth_failed"
    assert "gone.sock cannot be reached" in str(host["error"]), host
    # SSH_AUTH_SOCK (the default), which names no agent here, and "none": no key to offer.
    for form in ("SSH_AUTH_SOCK", "none"):
        host = status(form)
        assert host["status"] == "auth_failed", (form, host)


def test_a_key_file_not_here_leaves_the_agent_to_offer_the_key(
    sim_fleet_factory, cli: Cli, tmp_path: Path, agent: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A team's inventory names ~/.ssh/cluster_key; on this laptop the key lives in the
    # agent only. ssh skips the missing file and offers the agent's keys; fleetclean
    # stopped at "private key ... not found".
    fleet = sim_fleet_factory(1)
    home = agent_holds_the_key(fleet, agent, tmp_path, monkeypatch)
    missing = home / ".ssh" / "cluster_key"
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(fleet.inventory_path.read_text().replace(
        str(fleet.client_key_path), str(missing)))
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent))
    res = cli("status", "-i", inventory, "--connect-timeout", "5", "--json")
    assert res.host("node01")["status"] == "clean", res.out
    # No agent either: refused, and the error names the file that is not here.
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-agent-here.sock"))
    host = cli("status", "-i", inventory, "--connect-timeout", "5", "--json").host("node01")
    assert host["status"] == "auth_failed"
    assert f"identity file {missing} is not here" in str(host["error"]), host
