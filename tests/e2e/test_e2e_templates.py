"""An Ansible inventory whose connection variables are Jinja expressions, over SSH to a
simulated node: ``lookup('env', ...)`` for the user and the key's directory, ``default``
and ``hostvars[inventory_hostname]`` for the address, ``int`` for the port. Ansible
renders them from the host's variables and the controller's environment; fleetclean left
each unset, reached "node01" by its inventory name (no such host) and called it
unreachable (RELIABILITY 67)."""

from __future__ import annotations

from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim


def test_a_node_is_reached_through_the_templates_ansible_renders(
    fleet: SimFleet, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = fleet.node("node01")
    key = Path(fleet.client_key_path)
    monkeypatch.setenv("FC_TPL_OPERATOR", "root")
    monkeypatch.setenv("FC_TPL_KEYS", str(key.parent))
    monkeypatch.delenv("FC_TPL_UNSET", raising=False)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  vars:\n"
        "    ansible_user: \"{{ lookup('env', 'FC_TPL_UNSET') | default(lookup('env', "
        "'FC_TPL_OPERATOR'), true) }}\"\n"
        "    ansible_host: \"{{ hostvars[inventory_hostname]['ib_ip'] | "
        "default(inventory_hostname) }}\"\n"
        "    ansible_port: \"{{ ssh_port | int }}\"\n"
        "    ansible_ssh_private_key_file: \"{{ lookup('env', 'FC_TPL_KEYS') ~ '/' ~ "
        "key_name }}\"\n"
        f"    ansible_ssh_common_args: '-o UserKnownHostsFile={fleet.known_hosts_path}'\n"
        "  hosts:\n"
        f"    node01: {{ib_ip: '{node.address}', ssh_port: '22', key_name: {key.name}}}\n")
    (worker,) = fleet.spawn("node01", "stubborn", gpu=3, mib=6144)
    listed = cli("inventory", "-i", inventory, "--json")
    (host,) = listed.json()["hosts"]
    assert (listed.code, host["address"], host["user"], host["port"]) == (
        0, node.address, "root", 22)
    res = cli("status", "-i", inventory, "--json")
    assert "Jinja" not in res.err and "renders empty" not in res.err  # status says them
    status = res.host("node01")
    assert (res.code, status["status"]) == (1, "dirty"), res.err
    used = [g["memory_used_mib"] for g in status["gpus"]]
    assert used == fleet.gpu_used_mib("node01") and used[3] == 6144
    assert [p["pid"] for p in status["gpus"][3]["processes"]] == [worker]
