"""Inline host lists (-i 'gpu01,gpu02,'), several -i merged as Ansible does, -c and --local."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.cli import Env, main
from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory, local_inventory

Write = Callable[[str, str], Path]


def run_cli(*argv: str | Path, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = Env(stdout=out, stderr=err,
              environ={"NO_COLOR": "1", "FLEETCLEAN_SSH_CONFIG": "", **(environ or {})})
    code = main([str(a) for a in argv], env)
    return code, out.getvalue(), err.getvalue()


def test_a_host_list_with_a_trailing_comma_is_hosts_not_a_file() -> None:
    inv = load_inventory("gpu01,gpu02,", ssh_config="")
    assert list(inv.hosts) == ["gpu01", "gpu02"]
    assert [(h.address, h.port, h.groups) for h in inv.select(None)] == [
        ("gpu01", 22, ("ungrouped",)),
        ("gpu02", 22, ("ungrouped",)),
    ]


def test_one_host_needs_only_its_trailing_comma() -> None:
    assert list(load_inventory("gpu01,", ssh_config="").hosts) == ["gpu01"]


def test_ranges_and_ports_in_a_host_list() -> None:
    inv = load_inventory("gpu[01:16].lab, login:2222,", ssh_config="")
    assert len(inv.hosts) == 17
    assert inv.hosts["gpu16.lab"].address == "gpu16.lab"
    assert inv.hosts["login"].port == 2222
    assert [h.name for h in inv.select("gpu0[1:3].lab")] == ["gpu01.lab", "gpu02.lab", "gpu03.lab"]


def test_hosts_of_a_list_take_their_settings_from_ssh_config(write: Write) -> None:
    config = write("ssh_config", "Host gpu*\n  HostName 10.9.0.%h\n  User ops\n  Port 2200\n"
                   "  IdentityFile /keys/lab\n")
    host = load_inventory("gpu01,", ssh_config=config).hosts["gpu01"]
    assert (host.address, host.user, host.port, host.key) == ("10.9.0.gpu01", "ops", 2200,
                                                              "/keys/lab")


def test_a_bad_range_in_a_host_list_names_the_list() -> None:
    with pytest.raises(InventoryError) as err:
        load_inventory("gpu[09:01],", ssh_config="")
    assert str(err.value).startswith("-i 'gpu[09:01],': host range 'gpu[09:01]' runs backwards")


def test_a_file_that_exists_wins_over_a_host_list_reading(write: Write, tmp_path: Path) -> None:
    odd = write("a,b", "[gpus]\ngpu07\n")
    assert list(load_inventory(odd, ssh_config="").hosts) == ["gpu07"]


def test_a_missing_bare_word_suggests_the_trailing_comma() -> None:
    with pytest.raises(InventoryError, match=r"end it with a comma: -i 'gpu01,'"):
        load_inventory("gpu01", ssh_config="")


def test_several_sources_unite_groups_and_the_later_source_wins(write: Write) -> None:
    first = write("a.yml", "all:\n  vars: {grace: 5, keep: 1}\n  children:\n    training:\n"
                  "      hosts:\n        gpu01: {ansible_user: root, slot: a}\n        gpu02:\n")
    second = write("b.ini", "[training]\ngpu01 ansible_user=ops slot=b\ngpu03\n"
                   "[all:vars]\ngrace=30\n")
    inv = load_inventory([first, second, "gpu09,"], ssh_config="")
    assert list(inv.hosts) == ["gpu01", "gpu02", "gpu03", "gpu09"]
    assert inv.groups["training"] == ("gpu01", "gpu02", "gpu03")
    gpu01 = inv.hosts["gpu01"]
    assert gpu01.user == "ops" and gpu01.vars == {"grace": 30, "keep": 1, "slot": "b"}
    assert inv.hosts["gpu09"].groups == ("ungrouped",)
    assert inv.path == f"{first} + {second} + -i 'gpu09,'"


def test_an_error_in_the_second_source_names_that_source(write: Write) -> None:
    first = write("a.yml", "all:\n  hosts:\n    gpu01:\n")
    second = write("b.yml", "all:\n  hosts:\n    gpu02: {ansible_port: many}\n")
    with pytest.raises(InventoryError, match=rf"^{second}:3:27: ansible_port must be"):
        load_inventory([first, second], ssh_config="")


def test_local_inventory_is_this_machine_without_ssh() -> None:
    hosts = local_inventory().select(None)
    assert [(h.name, h.address, h.connection) for h in hosts] == [
        (socket.gethostname(), "localhost", "local")
    ]


def test_connection_option_applies_to_every_selected_host() -> None:
    code, out, err = run_cli("inventory", "-i", "gpu[01:03],", "-c", "local", "--json")
    assert code == 0, err
    assert [h["connection"] for h in json.loads(out)["hosts"]] == ["local"] * 3


def test_local_option_lists_one_local_host_named_after_this_machine() -> None:
    code, out, err = run_cli("inventory", "--local", "--json")
    assert code == 0, err
    [host] = json.loads(out)["hosts"]
    assert (host["name"], host["connection"]) == (socket.gethostname(), "local")


def test_the_default_inventory_comes_from_the_environment(write: Write) -> None:
    path = write("lab.ini", "[gpus]\ngpu[01:02]\n")
    code, out, err = run_cli("inventory", "--json", environ={"FLEETCLEAN_INVENTORY": str(path)})
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)["hosts"]] == ["gpu01", "gpu02"]
    code, out, _ = run_cli("inventory", "-i", "gpu05,", "--json",
                           environ={"FLEETCLEAN_INVENTORY": str(path)})
    assert [h["name"] for h in json.loads(out)["hosts"]] == ["gpu05"]


def test_without_any_inventory_the_command_says_how_to_give_one() -> None:
    code, out, err = run_cli("status")
    assert code == 4 and out == ""
    assert err.count("\n") == 1
    assert "no inventory given" in err and "FLEETCLEAN_INVENTORY" in err and "--local" in err
