"""Reading inventories: precedence, connection variables, YAML/INI twins, JSON and table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from fleetclean.inventory import inventory_json, load_inventory, render_inventory_table

INVENTORIES = Path(__file__).resolve().parents[2] / "inventories"

Write = Callable[[str, str], Path]

PRECEDENCE_YAML = """\
all:
  vars: {level: all, only_all: 1}
  hosts:
    solo:
  children:
    parent:
      vars: {level: parent, only_parent: 1}
      children:
        child:
          vars: {level: child}
          hosts:
            gpu01: {level: host}
            gpu02:
    zeta:
      vars: {sibling: zeta}
      hosts: {gpu02: }
    alpha:
      vars: {sibling: alpha}
      hosts: {gpu02: }
"""


def test_host_beats_child_beats_parent_beats_all(write: Write) -> None:
    hosts = load_inventory(write("p.yml", PRECEDENCE_YAML)).hosts
    assert hosts["gpu01"].vars["level"] == "host"
    assert hosts["gpu02"].vars["level"] == "child"
    assert hosts["gpu02"].vars["only_parent"] == 1
    assert hosts["solo"].vars == {"level": "all", "only_all": 1}


def test_siblings_at_one_depth_alphabetical_later_wins(write: Write) -> None:
    hosts = load_inventory(write("p.yml", PRECEDENCE_YAML)).hosts
    # alpha and zeta are both children of all; zeta sorts last, so zeta wins,
    # even though alpha is written after it.
    assert hosts["gpu02"].vars["sibling"] == "zeta"


def test_group_priority_overrides_alphabetical_order(write: Write) -> None:
    text = PRECEDENCE_YAML.replace(
        "{sibling: alpha}", "{sibling: alpha, ansible_group_priority: 5}"
    )
    host = load_inventory(write("p.yml", text)).hosts["gpu02"]
    assert host.vars["sibling"] == "alpha"
    assert "ansible_group_priority" not in host.vars


def test_deeper_group_beats_shallower_sibling_whatever_the_name(write: Write) -> None:
    # "child" is at depth 2, "zeta" at depth 1: depth decides before the name does.
    text = PRECEDENCE_YAML.replace("{level: child}", "{level: child, sibling: child}")
    assert load_inventory(write("p.yml", text)).hosts["gpu02"].vars["sibling"] == "child"


def test_groups_and_ungrouped_as_ansible_has_them(write: Write) -> None:
    inventory = load_inventory(write("p.yml", PRECEDENCE_YAML))
    assert list(inventory.hosts) == ["solo", "gpu01", "gpu02"]
    assert inventory.hosts["gpu02"].groups == ("alpha", "child", "parent", "zeta")
    assert inventory.hosts["solo"].groups == ("ungrouped",)
    assert inventory.groups == {
        "all": ("solo", "gpu01", "gpu02"),
        "parent": ("gpu01", "gpu02"),
        "child": ("gpu01", "gpu02"),
        "zeta": ("gpu02",),
        "alpha": ("gpu02",),
        "ungrouped": ("solo",),
    }


def test_connection_variables_and_aliases(write: Write) -> None:
    text = """\
all:
  vars:
    ansible_ssh_user: admin
    ansible_become: "yes"
    ansible_become_user: gpuadmin
  hosts:
    gpu01:
      ansible_ssh_host: 10.0.0.1
      ansible_ssh_port: "2222"
      ansible_ssh_private_key_file: ~/.ssh/lab
      ansible_connection: paramiko
      ansible_python_interpreter: /usr/bin/python3
    gpu02:
      ansible_host: 10.0.0.2
      ansible_ssh_host: 10.9.9.9
      ansible_user: root
      ansible_become: 0
    laptop:
      ansible_connection: local
"""
    hosts = load_inventory(write("c.yml", text)).hosts
    gpu01, gpu02, laptop = hosts["gpu01"], hosts["gpu02"], hosts["laptop"]
    assert (gpu01.address, gpu01.port, gpu01.user) == ("10.0.0.1", 2222, "admin")
    assert gpu01.key == str(Path("~/.ssh/lab").expanduser())
    assert (gpu01.connection, gpu01.become, gpu01.become_user) == ("ssh", True, "gpuadmin")
    # every ansible_* variable is Ansible's own: never a playbook variable
    assert gpu01.vars == {}
    # As Ansible's documentation has it, the connection-specific name beats the generic
    # one wherever each is set: all:vars' ansible_ssh_user beats gpu02's own ansible_user
    # (fleetclean took root, which Ansible does not reach), ansible_ssh_host its
    # ansible_host.
    assert (gpu02.address, gpu02.user, gpu02.become) == ("10.9.9.9", "admin", False)
    assert (laptop.connection, laptop.address, laptop.port) == ("local", "laptop", 22)


def test_ssh_args_give_options_jump_host_and_config(write: Write) -> None:
    write("lab_ssh_config", "Host gpu01\n  User fromconfig\n")
    text = """\
all:
  vars:
    ansible_ssh_common_args: >-
      -C -o StrictHostKeyChecking=yes -o 'ConnectTimeout 5' -J ops@bastion -F lab_ssh_config
  hosts:
    gpu01:
      ansible_ssh_extra_args: -o ServerAliveInterval=15 -o ProxyJump=other@jump
"""
    host = load_inventory(write("s.yml", text)).hosts["gpu01"]
    assert host.ssh_options == {
        "stricthostkeychecking": "yes",
        "connecttimeout": "5",
        "serveraliveinterval": "15",
    }
    # ssh keeps the first ProxyJump: the common args' -J, written before the extra args.
    assert host.proxy_jump == "ops@bastion"
    assert host.user == "fromconfig"


def test_host_port_suffix(write: Write) -> None:
    hosts = load_inventory(write("p.yml", "all:\n  hosts:\n    gpu[1:2]:2222:\n")).hosts
    assert [(h.name, h.port) for h in hosts.values()] == [("gpu1", 2222), ("gpu2", 2222)]


def test_same_host_in_two_groups_merges(write: Write) -> None:
    text = """\
all:
  children:
    a: {hosts: {gpu01: {ansible_host: 10.0.0.1, x: 1}}}
    b: {hosts: {gpu01: {ansible_host: 10.0.0.1, x: 2}}}
"""
    host = load_inventory(write("d.yml", text)).hosts["gpu01"]
    assert (host.address, host.vars["x"], host.groups) == ("10.0.0.1", 2, ("a", "b"))


def test_yaml_twin_and_ini_twin_give_the_same_hosts() -> None:
    from_yaml = load_inventory(INVENTORIES / "lab.yml")
    from_ini = load_inventory(INVENTORIES / "lab.ini")
    assert len(from_yaml.hosts) == 16
    assert from_yaml.hosts == from_ini.hosts
    assert from_yaml.groups == from_ini.groups
    assert inventory_json(from_yaml.select(None)) == inventory_json(from_ini.select(None))


def test_lab_example_reads_as_documented() -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    assert set(inventory.groups) == {"all", "extraction", "training", "canary", "ungrouped"}
    gpu = inventory.hosts["gpu05.lab"]
    assert (gpu.address, gpu.user, gpu.proxy_jump) == ("gpu05.lab", "root", "ops@bastion.lab")
    assert gpu.vars["max_used_mib"] == 512
    assert gpu.ssh_options["stricthostkeychecking"] == "yes"
    canary = inventory.hosts["h200-08.lab"]
    assert (canary.address, canary.vars["grace"], canary.vars["verify_timeout"]) == (
        "10.20.0.108",
        30,
        120,
    )


def test_ini_is_recognised_without_extension(write: Write) -> None:
    ini = (INVENTORIES / "lab.ini").read_text(encoding="utf-8")
    assert (
        load_inventory(write("hosts", ini)).hosts == load_inventory(INVENTORIES / "lab.ini").hosts
    )
    yml = (INVENTORIES / "lab.yml").read_text(encoding="utf-8")
    assert (
        load_inventory(write("inventory", yml)).hosts
        == load_inventory(INVENTORIES / "lab.yml").hosts
    )


def test_ini_details(write: Write) -> None:
    text = """\
# hosts before any section are ungrouped
lonely ansible_host=10.0.0.9
[gpus]
gpu01:2200 protect='["a b", "c"]' max_used_mib=512  # a comment
gpu02 ansible_become=true
[gpus:vars]
note = two words ; and a comment
quoted='22'
"""
    hosts = load_inventory(write("x.ini", text)).hosts
    assert hosts["lonely"].groups == ("ungrouped",)
    assert hosts["gpu01"].port == 2200
    assert hosts["gpu01"].vars == {
        "note": "two words",
        "quoted": "22",
        "protect": ["a b", "c"],
        "max_used_mib": 512,
    }
    assert hosts["gpu02"].become is True


def test_sim_example_matches_what_the_simulator_writes() -> None:
    inventory = load_inventory(INVENTORIES / "sim-example.yml")
    node = inventory.select("sim")[0]
    assert (node.name, node.address, node.port, node.user) == ("node01", "127.0.1.1", 22, "root")
    assert node.ssh_options == {
        "userknownhostsfile": "/tmp/fleetclean-sim/known_hosts",
        "stricthostkeychecking": "yes",
    }
    assert node.groups == ("sim",)


def test_inventory_json_is_the_documented_shape(write: Write) -> None:
    text = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.1\n      day: 2024-05-01\n"
    data = inventory_json(load_inventory(write("j.yml", text)).select(None))
    assert data == {
        "hosts": [
            {
                "name": "gpu01",
                "address": "10.0.0.1",
                "port": 22,
                "user": None,
                "key": None,
                "connection": "ssh",
                "become": False,
                "groups": ["ungrouped"],
                "vars": {"day": "2024-05-01"},
            }
        ]
    }
    json.dumps(data)


def test_table_shows_every_selected_host() -> None:
    hosts = load_inventory(INVENTORIES / "lab.yml").select("canary:gpu01.lab")
    console = Console(width=200, record=True, color_system=None)
    console.print(render_inventory_table(hosts))
    text = console.export_text()
    assert "2 hosts" in text
    assert "h200-08.lab" in text and "10.20.0.108" in text and "ops@bastion.lab" in text


@pytest.mark.parametrize("value", ["yes", "True", "on", "1", 1, True])
def test_become_accepts_ansible_truths(write: Write, value: object) -> None:
    text = f"all:\n  hosts:\n    gpu01:\n      ansible_become: {json.dumps(value)}\n"
    assert load_inventory(write("b.yml", text)).hosts["gpu01"].become is True


def test_unsafe_tag_is_plain_text_and_merge_keys_work(write: Write) -> None:
    text = """\
all:
  vars:
    pattern: !unsafe '{{ not a template }}'
  children:
    a:
      vars: &defaults {grace: 5, max_used_mib: 100}
      hosts: {gpu01: }
    b:
      vars:
        <<: *defaults
        grace: 9
      hosts: {gpu02: }
"""
    hosts = load_inventory(write("u.yml", text)).hosts
    assert hosts["gpu01"].vars["pattern"] == "{{ not a template }}"
    assert hosts["gpu02"].vars["grace"] == 9
    assert hosts["gpu02"].vars["max_used_mib"] == 100
