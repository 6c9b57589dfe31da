"""What ssh takes from its own arguments and its config beyond the first key: every identity
file in order, -l/-p/-o User/Port/HostName in ansible_ssh_common_args, and whether the
agent's keys are offered (IdentitiesOnly)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory
from fleetclean.inventory.ssh_settings import SshArgsError, parse_ssh_args

Write = Callable[[str, str], Path]

CONFIG = """\
Host gpu*
  IdentityFile /keys/config_a
  IdentityFile /keys/config_b
  IdentitiesOnly yes
  User fromconfig
  Port 2299
"""


def _host(write: Write, host_vars: str, config: str = CONFIG) -> object:
    text = f"all:\n  hosts:\n    gpu01:\n{host_vars}"
    return load_inventory(write("a.yml", text), ssh_config=write("ssh_config", config)
                          ).hosts["gpu01"]


def test_every_identity_file_in_ssh_order(write: Write) -> None:
    # ssh tries Ansible's -o IdentityFile (the inventory key) first, then -i of the ssh
    # arguments, then every IdentityFile of the config; only the first one was kept.
    host = _host(write, "      ansible_ssh_private_key_file: /keys/inv\n"
                        "      ansible_ssh_common_args: -i /keys/arg -o IdentityFile=/keys/opt\n")
    assert host.key == "/keys/inv"
    assert host.identities == ("/keys/inv", "/keys/arg", "/keys/opt", "/keys/config_a",
                               "/keys/config_b")
    assert host.ssh_options["identitiesonly"] == "yes"


def test_config_identity_files_alone(write: Write) -> None:
    host = _host(write, "      ansible_host: 10.0.0.1\n", config=CONFIG.replace("gpu*", "*"))
    assert (host.key, host.identities) == ("/keys/config_a", ("/keys/config_a", "/keys/config_b"))


def test_user_and_port_of_the_ssh_arguments_beat_the_config(write: Write) -> None:
    host = _host(write, "      ansible_ssh_common_args: -l fromargs -p 2222\n")
    assert (host.user, host.port) == ("fromargs", 2222)
    host = _host(write, "      ansible_ssh_common_args: -o User=optuser -o Port=2223\n")
    assert (host.user, host.port) == ("optuser", 2223)


def test_inventory_user_and_port_beat_the_ssh_arguments(write: Write) -> None:
    # Ansible writes its own -o User= and -o Port= before the common args; ssh keeps the first.
    host = _host(write, "      ansible_user: inv\n      ansible_port: 22\n"
                        "      ansible_ssh_common_args: -l fromargs -p 2222\n")
    assert (host.user, host.port) == ("inv", 22)


def test_hostname_of_the_ssh_arguments_is_where_ssh_connects(write: Write) -> None:
    host = _host(write, "      ansible_host: gpu01.lab\n"
                        "      ansible_ssh_common_args: -o HostName=10.9.0.1\n")
    assert host.address == "10.9.0.1"


def test_a_port_that_is_not_a_number_names_the_file(write: Write) -> None:
    with pytest.raises(InventoryError, match="port 'ssh' in the ssh arguments") as err:
        _host(write, "      ansible_ssh_common_args: -p ssh\n")
    assert "a.yml" in str(err.value)


def test_parse_keeps_every_identity_and_the_first_of_the_rest() -> None:
    # ssh keeps the first value of an option (`ssh -G -l one -l two` says user one).
    args = parse_ssh_args("-i /a -l one -l two -i/b -oUser=three -p 1 -o Port=2 "
                          "-o UserKnownHostsFile=/first -o UserKnownHostsFile=/second")
    assert (args.identities, args.user, args.port) == (("/a", "/b"), "one", 1)
    assert args.options == {"userknownhostsfile": "/first"}
    with pytest.raises(SshArgsError, match="'-i' at the end"):
        parse_ssh_args("-C -i")


def test_a_proxycommand_of_the_ssh_arguments_beats_the_configs_proxyjump(write: Write) -> None:
    # ssh reads its command line first and keeps the first of ProxyJump/ProxyCommand: the
    # config's ProxyJump took the host through a bastion the inventory had routed around.
    config = CONFIG + "  ProxyJump bastion\n"
    host = _host(write, "      ansible_ssh_common_args: -o ProxyCommand='nc -x p:1080 %h %p'\n",
                 config=config)
    assert host.proxy_jump is None
    assert host.ssh_options["proxycommand"] == "nc -x p:1080 %h %p"
    assert _host(write, "      ansible_port: 22\n", config=config).proxy_jump == "bastion"


def test_common_args_come_before_extra_args(write: Write) -> None:
    # Ansible writes ansible_ssh_common_args before ansible_ssh_extra_args; ssh keeps the
    # first: StrictHostKeyChecking=no in the extra args did not switch the check off.
    host = _host(write, "      ansible_ssh_common_args: -o StrictHostKeyChecking=yes -l a\n"
                        "      ansible_ssh_extra_args: -o StrictHostKeyChecking=no -l b\n")
    assert (host.ssh_options["stricthostkeychecking"], host.user) == ("yes", "a")
