"""ansible_become_* in inventories, and the command line's become as their defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.errors import InventoryError
from fleetclean.inventory import inventory_json, load_inventory

Write = Callable[[str, str], Path]

LAB = """\
all:
  hosts:
    gpu01:
      ansible_become: yes
      ansible_become_method: sudo
      ansible_become_password: "s3cret pass"
    gpu02:
      ansible_become: no
    gpu03:
"""


def test_become_password_is_a_secret_never_printed(write: Write) -> None:
    path = write("lab.yml", LAB)
    path.chmod(0o600)
    inv = load_inventory(path)
    host = inv.hosts["gpu01"]
    assert host.become and host.become_password is not None
    assert host.become_password.reveal() == "s3cret pass"
    assert "s3cret" not in repr(host) and "s3cret" not in str(inventory_json([host]))
    assert inv.warnings == ()


def test_a_password_others_can_read_is_warned_about_once_per_file(write: Write) -> None:
    path = write("lab.yml", LAB.replace("    gpu03:\n", "    gpu03: {ansible_become_pass: x}\n"))
    path.chmod(0o640)
    assert load_inventory(path).warnings == (
        f"{path} holds ansible_become_password and is readable by others than its owner "
        f"(mode 0640); chmod 600 {path}",
    )


def test_command_line_become_loses_to_the_inventorys_own(write: Write) -> None:
    inv = load_inventory(write("lab.yml", LAB), defaults={
        "ansible_become": True, "ansible_become_user": "gpuadmin"})
    hosts = inv.hosts
    assert (hosts["gpu01"].become, hosts["gpu02"].become, hosts["gpu03"].become) == (
        True, False, True)
    assert hosts["gpu03"].become_user == "gpuadmin"


@pytest.mark.parametrize(("line", "expect"), [
    ("ansible_become_method: su", "ansible_become_method 'su' is not supported "
     "(fleetclean becomes root through sudo only: write sudo or remove the line)"),
    ("ansible_become_password: [hunter2]", "ansible_become_password must be text "
     "(write ansible_become_password: 'PASSWORD')"),
    ('ansible_become_password: "hunter2\\nmore"', "ansible_become_password is empty "
     "or holds a line break (sudo reads one line: give the password on one line)"),
])
def test_bad_become_settings_name_file_line_and_fix_never_the_password(
    write: Write, line: str, expect: str
) -> None:
    prefix = "    gpu01: {"
    path = write("bad.yml", f"all:\n  hosts:\n{prefix}{line}}}\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    column = len(prefix) + line.index(": ") + 3  # the value's first character
    assert str(err.value) == f"{path}:3:{column}: {expect}"
    assert "hunter2" not in str(err.value)


def test_ini_inventories_give_the_same(write: Write) -> None:
    path = write("lab.ini", "[gpus]\ngpu01 ansible_become=true ansible_become_password=pw\n")
    path.chmod(0o600)
    host = load_inventory(path).hosts["gpu01"]
    assert host.become and host.become_password is not None
    assert host.become_password.reveal() == "pw"
