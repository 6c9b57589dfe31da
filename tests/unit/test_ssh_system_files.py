"""ssh's system-wide files (``transport/system.py``): ssh_config after the user's own, and
ssh_known_hosts after the user's known_hosts, as ``ssh`` reads them."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from fleetclean.inventory import load_inventory
from fleetclean.inventory.ssh_settings import default_config_path
from fleetclean.transport.hops import load_config
from fleetclean.transport.hostkeys import KnownHostsCache


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(~/.ssh, the system directory), both empty; no FLEETCLEAN_SSH_CONFIG."""
    home, system = tmp_path / "home", tmp_path / "etc-ssh"
    (home / ".ssh").mkdir(parents=True)
    system.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FLEETCLEAN_SSH_SYSTEM_DIR", str(system))
    monkeypatch.delenv("FLEETCLEAN_SSH_CONFIG", raising=False)
    return home / ".ssh", system


def test_the_system_config_comes_after_the_users_and_fills_what_it_leaves(
    dirs: tuple[Path, Path],
) -> None:
    user, system = dirs
    # The user's file ends inside a Host block: the system file's first lines, before any
    # block of its own, still apply to every host (ssh reads them at the top level).
    (user / "config").write_text("Host node01\n  User alice\n  Port 2201\n")
    (system / "ssh_config").write_text(
        "IdentityFile /site/key\nInclude site.d/*.conf\nHost node*\n  User ops\n")
    (system / "site.d").mkdir()  # relative to the system directory, as in ssh
    (system / "site.d" / "jump.conf").write_text("Host node02\n  ProxyJump bastion\n")

    path = default_config_path()
    assert path == str(user / "config")
    config = load_config(path, system_after=True)
    first, second = config.lookup("node01"), config.lookup("node02")
    assert (first["user"], first["port"]) == ("alice", "2201")  # the user's own win
    assert second["user"] == "ops" and second["proxyjump"] == "bastion"
    assert second["identityfile"] == ["/site/key"] == first["identityfile"]


def test_the_system_config_alone_where_the_user_has_none_and_never_with_F(
    dirs: tuple[Path, Path], tmp_path: Path,
) -> None:
    user, system = dirs
    (system / "ssh_config").write_text("Host node*\n  User ops\n")
    path = default_config_path()
    assert path == str(system / "ssh_config")
    assert load_config(path, system_after=True).lookup("node07")["user"] == "ops"
    # -F (an inventory's ansible_ssh_common_args, the CLI's -F): ssh reads that file alone,
    # ~/.ssh/config itself too when it is named so.
    given = tmp_path / "given_config"
    given.write_text("Host other\n  User x\n")
    assert "user" not in load_config(str(given)).lookup("node07")
    (user / "config").write_text("Host other\n  User x\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node07\n")
    assert load_inventory(inventory).hosts["node07"].user == "ops"
    named = load_inventory(inventory, ssh_config=str(user / "config"))
    assert named.hosts["node07"].user is None


def test_red_hats_match_final_all_is_read_and_a_file_paramiko_refuses_is_left_out_said(
    dirs: tuple[Path, Path], tmp_path: Path,
) -> None:
    user, system = dirs
    (user / "config").write_text("Host node01\n  User alice\n")
    # Red Hat's ssh_config.d/50-redhat.conf opens with `Match final all`, which ssh reads
    # as `Match final` and paramiko refused: every run on such a login node stopped.
    (system / "ssh_config").write_text("Include ssh_config.d/*.conf\n")
    (system / "ssh_config.d").mkdir()
    (system / "ssh_config.d" / "50-redhat.conf").write_text(
        "Match final all\n  GSSAPIAuthentication yes\nHost node*\n  Port 2222\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node01\nnode02\n")
    loaded = load_inventory(inventory)
    assert [(h.user, h.port) for h in loaded.hosts.values()] == [("alice", 2222), (None, 2222)]
    assert loaded.warnings == ()
    # What paramiko cannot parse at all is left out, said, and the run goes on.
    (system / "ssh_config.d" / "50-redhat.conf").write_text("Host node*\n  Port\n")
    loaded = load_inventory(inventory)
    assert [(h.user, h.port) for h in loaded.hosts.values()] == [("alice", 22), (None, 22)]
    (said,) = loaded.warnings
    assert said.startswith(f"{system / 'ssh_config'}: ssh's system-wide config cannot be read")
    assert "FLEETCLEAN_SSH_SYSTEM_DIR" in said


def _line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def test_system_known_hosts_are_read_after_the_users_and_never_written(
    dirs: tuple[Path, Path],
) -> None:
    user, system = dirs
    site_key, old_key, mine, new_key = (paramiko.RSAKey.generate(1024) for _ in range(4))
    # A login node's file lists every compute node; the site's entry for node02 lags behind
    # its reinstall, which the user's own file already has.
    (system / "ssh_known_hosts").write_text(_line("node01", site_key) + _line("node02", old_key))
    (system / "ssh_known_hosts2").write_text(_line("node03", site_key))
    (user / "known_hosts").write_text(_line("node02", mine))
    known = KnownHostsCache(()).get(None)

    def key_of(name: str) -> str | None:
        found = known.keys.lookup(name)
        return None if found is None else found["ssh-rsa"].get_base64()

    assert key_of("node01") == site_key.get_base64() == key_of("node03")
    assert key_of("node02") == mine.get_base64()
    known.record("node04", new_key)
    assert "node04" in (user / "known_hosts").read_text()
    assert "node04" not in (system / "ssh_known_hosts").read_text()
    # GlobalKnownHostsFile from a config replaces the default files; "none" reads none.
    other = user / "site_hosts"
    other.write_text(_line("node05", site_key))
    chosen = KnownHostsCache(()).get(None, str(other)).keys
    assert chosen.lookup("node05") is not None and chosen.lookup("node01") is None
    assert KnownHostsCache(()).get(None, "none").keys.lookup("node01") is None


def test_hash_known_hosts_from_the_system_config_hashes_a_new_keys_name(
    dirs: tuple[Path, Path], tmp_path: Path,
) -> None:
    # Debian's and Ubuntu's /etc/ssh/ssh_config say HashKnownHosts yes: ssh then writes
    # a new host's name hashed, and the user's known_hosts does not list the fleet.
    user, system = dirs
    (system / "ssh_config").write_text("Host *\n  HashKnownHosts yes\n")
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("gpu01 ansible_host=10.0.0.7\n")
    host = load_inventory(inventory).hosts["gpu01"]
    assert host.ssh_options.get("hashknownhosts") == "yes"
    key = paramiko.RSAKey.generate(1024)
    KnownHostsCache(()).get(None).record("10.0.0.7", key, hashed=True)
    written = (user / "known_hosts").read_text()
    assert written.startswith("|1|") and "10.0.0.7" not in written
    found = KnownHostsCache(()).get(None).keys.lookup("10.0.0.7")  # a later run reads it
    assert found is not None and found["ssh-rsa"].get_base64() == key.get_base64()
