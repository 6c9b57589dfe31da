"""~/.ssh/config fills what the inventory leaves open; the inventory always wins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.inventory import load_inventory
from fleetclean.inventory.ssh_settings import SshArgsError, parse_ssh_args

Write = Callable[[str, str], Path]

CONFIG = """\
Host gpu01
  HostName 10.1.0.1
  User alice
  Port 2201
  IdentityFile ~/.ssh/alice_key
  IdentityFile ~/.ssh/second_key
  ProxyJump bastion.lab
  UserKnownHostsFile ~/.ssh/known_hosts.lab

Host 10.2.0.*
  User bob
  ProxyJump none

Host *
  User nobody
"""


def test_config_fills_every_field(write: Write) -> None:
    config = write("ssh_config", CONFIG)
    inventory = load_inventory(write("a.yml", "all:\n  hosts:\n    gpu01:\n"), ssh_config=config)
    host = inventory.hosts["gpu01"]
    assert (host.address, host.port, host.user) == ("10.1.0.1", 2201, "alice")
    assert host.key == str(Path("~/.ssh/alice_key").expanduser())
    assert host.proxy_jump == "bastion.lab"
    assert host.ssh_options == {
        "userknownhostsfile": str(Path("~/.ssh/known_hosts.lab").expanduser())
    }


def test_inventory_values_win_over_config(write: Write) -> None:
    config = write("ssh_config", CONFIG)
    text = """\
all:
  hosts:
    gpu01:
      ansible_port: 22
      ansible_user: root
      ansible_ssh_private_key_file: /keys/root
      ansible_ssh_common_args: -J other@jump -o UserKnownHostsFile=/kh
"""
    host = load_inventory(write("a.yml", text), ssh_config=config).hosts["gpu01"]
    assert (host.address, host.port, host.user, host.key) == ("10.1.0.1", 22, "root", "/keys/root")
    assert host.proxy_jump == "other@jump"
    assert host.ssh_options == {"userknownhostsfile": "/kh"}


def test_config_is_matched_on_ansible_host_as_ssh_would(write: Write) -> None:
    config = write("ssh_config", CONFIG)
    text = "all:\n  hosts:\n    gpu01: {ansible_host: 10.2.0.7}\n    gpu02:\n"
    hosts = load_inventory(write("a.yml", text), ssh_config=config).hosts
    # ssh is given 10.2.0.7, so "Host gpu01" does not apply but "Host 10.2.0.*" does.
    assert (hosts["gpu01"].address, hosts["gpu01"].user) == ("10.2.0.7", "bob")
    assert (hosts["gpu01"].port, hosts["gpu01"].proxy_jump) == (22, None)
    assert (hosts["gpu02"].address, hosts["gpu02"].user) == ("gpu02", "nobody")


def test_missing_default_config_is_fine(
    write: Write, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FLEETCLEAN_SSH_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    host = load_inventory(write("a.yml", "all:\n  hosts:\n    gpu01:\n")).hosts["gpu01"]
    assert (host.address, host.port, host.user, host.key) == ("gpu01", 22, None, None)


def test_default_config_is_read_from_home(
    write: Write, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(CONFIG, encoding="utf-8")
    monkeypatch.delenv("FLEETCLEAN_SSH_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    host = load_inventory(write("a.yml", "all:\n  hosts:\n    gpu01:\n")).hosts["gpu01"]
    assert (host.address, host.user) == ("10.1.0.1", "alice")


def test_env_names_the_default_config(write: Write, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCLEAN_SSH_CONFIG", str(write("cfg", CONFIG)))
    host = load_inventory(write("a.yml", "all:\n  hosts:\n    gpu01:\n")).hosts["gpu01"]
    assert host.port == 2201


def test_local_hosts_ignore_ssh_config(write: Write) -> None:
    config = write("ssh_config", CONFIG)
    text = "all:\n  hosts:\n    gpu01: {ansible_connection: local}\n"
    host = load_inventory(write("a.yml", text), ssh_config=config).hosts["gpu01"]
    assert (host.address, host.user, host.port) == ("gpu01", None, 22)


@pytest.mark.parametrize(
    ("args", "options", "jump", "config"),
    [
        ("-o A=1 -oB=2 -o 'C 3' -o D 4", {"a": "1", "b": "2", "c": "3", "d": "4"}, None, None),
        ("-J a@b,c@d -o ProxyJump=e", {}, "a@b,c@d", None),
        ("-o ProxyJump=x -F ~/cfg -q -C", {}, "x", "~/cfg"),
        ("", {}, None, None),
    ],
)
def test_parse_ssh_args(
    args: str, options: dict[str, str], jump: str | None, config: str | None
) -> None:
    parsed = parse_ssh_args(args)
    assert (parsed.options, parsed.proxy_jump, parsed.config_file) == (options, jump, config)


@pytest.mark.parametrize("args", ["-o", "-o Key", "-J", "-F", "-o '=x'", "-o 'unclosed",
                                  "-J a -J b", "-p 0", "-p x", "-l"])
def test_bad_ssh_args(args: str) -> None:
    with pytest.raises(SshArgsError):
        parse_ssh_args(args)
