"""``-i slurm:``: sinfo's node list -> hosts in partition_* and state_* groups."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory
from fleetclean.inventory.slurm import parse_sinfo, state_groups

DATA = Path(__file__).parent.parent / "data" / "sinfo"


def fake_sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, rc: int = 0) -> None:
    """A ``sinfo`` first on PATH that prints ``out`` (a captured output) and exits ``rc``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "out.txt").write_text(out)
    script = bindir / "sinfo"
    script.write_text(
        f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat {tmp_path}/out.txt\n"
        f"[ {rc} = 0 ] || echo 'sinfo: error: Unable to contact slurm controller' >&2\n"
        f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_captured_states_fold_into_the_five_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sinfo(tmp_path, monkeypatch, (DATA / "sim-22.05-states.txt").read_text())
    inv = load_inventory("slurm:", ssh_config="")
    assert (tmp_path / "argv").read_text().split() == ["--noheader", "--Node", "--format=%N|%P|%T"]
    names = lambda limit: [h.name for h in inv.select(limit)]  # noqa: E731
    assert names("partition_gpu") == ["node01", "node02", "node03", "node04"]
    assert names("partition_debug") == ["node01"]
    assert names("state_alloc") == ["node01"]
    assert names("state_drain") == ["node02", "node04"]
    assert names("state_down") == ["node03"]
    assert names("partition_gpu:&state_drain:!node04") == ["node02"]
    assert names("slurm") == names(None)


def test_state_flags_are_dropped_and_compound_states_give_each_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sinfo(tmp_path, monkeypatch, (DATA / "flags.txt").read_text())
    inv = load_inventory("slurm:", ssh_config="")
    groups = {h.name: h.groups for h in inv.select(None)}
    assert "state_idle" in groups["node01"]
    assert "state_mixed" in groups["node02"]
    assert "state_drain" in groups["node03"]
    assert "state_down" in groups["node04"]
    assert {"state_idle", "state_drain"} <= set(groups["node05"])
    assert "state_completing" in groups["node06"]
    assert {"partition_long_run", "state_alloc"} <= set(groups["node07"])


def test_ssh_settings_come_from_a_yaml_inventory_given_as_well(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sinfo(tmp_path, monkeypatch, (DATA / "sim-22.05-states.txt").read_text())
    yml = tmp_path / "nodes.yml"
    yml.write_text(
        "all:\n  vars: {ansible_user: ops}\n  hosts:\n"
        "    node02: {ansible_host: 10.0.0.2, ansible_port: 2202}\n"
    )
    inv = load_inventory([str(yml), "slurm:"], ssh_config="")
    (node02,) = inv.select("state_drain:&node02")
    assert (node02.address, node02.port, node02.user) == ("10.0.0.2", 2202, "ops")
    (node03,) = inv.select("node03")
    assert (node03.address, node03.user) == ("node03", "ops")


def test_ssh_config_names_where_slurm_nodes_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sinfo(tmp_path, monkeypatch, "node01|gpu*|idle\n")
    config = tmp_path / "ssh_config"
    config.write_text("Host node01\n  HostName 127.0.1.1\n  Port 2222\n  User root\n")
    (node01,) = load_inventory("slurm:", ssh_config=config).select(None)
    assert (node01.address, node01.port, node01.user) == ("127.0.1.1", 2222, "root")


def test_sinfo_failure_is_one_line_naming_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_sinfo(tmp_path, monkeypatch, "", rc=1)
    with pytest.raises(InventoryError) as err:
        load_inventory("slurm:", ssh_config="")
    assert "-i 'slurm:'" in str(err.value)
    assert "Unable to contact slurm controller" in str(err.value)


def test_garbled_sinfo_output_is_refused() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_sinfo("node01|gpu*|idle\nPARTITION AVAIL NODES\n")
    assert state_groups("down*") == ["state_down"]
