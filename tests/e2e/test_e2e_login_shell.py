"""What the login shell's startup files do before fleetclean's bash starts: sshd runs the
command through the account's login shell, and bash started by sshd reads ~/.bashrc first
(Debian builds it so). A chatty one changes nothing; one that reads standard input takes
the first bytes of the script, and then nothing of the script may run: no half script
with its first definitions missing, on the node whose startup file did it, while the
others are cleaned as usual."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from simhelp import HOSTILE_BASHRC, Cli, alive, skip_unless_own_root

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
SETTLE = ("-e", "grace=1", "-e", "verify_timeout=20")


def test_a_startup_file_that_reads_stdin_stops_the_run_there_and_only_there(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    fleet = sim_fleet_factory(3)
    skip_unless_own_root(fleet)
    # node01 as an ~/.bashrc with an `ssh` (no -n) or a `read` in it; node02 a chatty one.
    fleet.node_path("node01", "/root/.bashrc").write_text("head -c 20000 >/dev/null\n")
    fleet.node_path("node02", "/root/.bashrc").write_text(
        "echo 'Welcome to the GPU cluster'\necho 'module: cuda/12.4 loaded' >&2\n")
    servers = {n: fleet.spawn(n, "sglang", gpus="0-7", mib=2048)
               for n in ("node01", "node02", "node03")}

    status = cli("status", "-i", fleet.inventory_path, "--json")
    assert status.host("node02")["status"] == status.host("node03")["status"] == "dirty"
    error = status.host("node01")["error"]
    assert status.host("node01")["status"] == "error"
    assert "nothing was run" in error and "~/.bashrc" in error, error

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, *SETTLE, "--json")
    assert res.host("node01")["status"] == "error"
    assert not res.host("node01")["signalled"]
    assert alive(fleet, "node01", servers["node01"]) == servers["node01"]
    for node in ("node02", "node03"):
        assert res.host(node)["status"] == "clean", res.out
        assert alive(fleet, node, servers[node]) == []
        assert fleet.gpu_used_mib(node) == [0] * 8


def test_what_the_login_exports_to_every_bash_changes_nothing_the_script_does(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    fleet = sim_fleet_factory(2)
    skip_unless_own_root(fleet)
    fleet.node_path("node01", "/root/.bashrc").write_text(HOSTILE_BASHRC)
    fleet.node_path("node01", "/root/bash_env.sh").write_text(
        "tr '\\0' ' ' </proc/$$/cmdline >> /tmp/bash_env.log; echo >> /tmp/bash_env.log\n")
    servers = {n: fleet.spawn(n, "sglang", gpus="0-7", mib=2048) for n in ("node01", "node02")}

    status = cli("status", "-i", fleet.inventory_path, "--json")
    for node in ("node01", "node02"):
        host = status.host(node)
        assert host["status"] == "dirty", host
        assert f"held by {servers[node][1]} sglang::scheduler_TP0" in host["error"], host

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, *SETTLE, "--json")
    for node in ("node01", "node02"):
        assert res.host(node)["status"] == "clean", res.out
        assert alive(fleet, node, servers[node]) == []
        assert fleet.gpu_used_mib(node) == [0] * 8
    # The login shell starts before its ~/.bashrc exports BASH_ENV; the script's bash
    # ignores it: no bash of any run sourced it.
    assert not fleet.node_path("node01", "/tmp/bash_env.log").exists()
