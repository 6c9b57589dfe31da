"""Scope filters for nodes that several people use: ``--user`` signals only that user's
processes (the others', root's included, are left running), on the simulated fleet with
processes of two users: root's, and nobody's (started with setpriv inside the node)."""

from __future__ import annotations

import pwd
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, alive

from fleetclean.results import records
from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
FAST = ("-e", "grace=1", "-e", "verify_timeout=1")


def spawn_as(fleet: SimFleet, node: str, user: str, *, gpu: int, mib: int, name: str) -> int:
    """A GPU holder of ``user`` called ``name``, detached (setsid -f), once it holds GPU."""
    code = f"import time; f = open('/dev/nvidia{gpu}'); time.sleep(3600)"
    account = pwd.getpwnam(user)  # the nodes share this machine's /etc/passwd
    # Its streams away from ours, or run_in would wait for it to end.
    detach = 'setsid -f "$@" </dev/null >/dev/null 2>&1'
    done = fleet.run_in(node, ["sh", "-c", detach, "sh", "setpriv", f"--reuid={account.pw_uid}",
                               f"--regid={account.pw_gid}",
                               "--clear-groups", "env", f"FLEETCLEAN_SIM_GPU_MIB={mib}",
                               "python3", "-c", code, name])
    assert done.returncode == 0, done.stderr
    for _ in range(300):
        found = [p.pid for p in fleet.processes(node) if p.cmdline.endswith(f" {name}")]
        if found and fleet.gpu_used_mib(node)[gpu] >= mib:
            return found[0]
        fleet.run_in(node, ["sleep", "0.05"])
    raise AssertionError(f"{name} did not start")


def test_user_signals_only_that_users_processes(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    # Both match the worker pattern (sglang) and hold a GPU: only the owner tells them apart.
    theirs = spawn_as(fleet, "node01", "nobody", gpu=2, mib=2048, name="sglang-worker-of-nobody")
    roots = spawn_as(fleet, "node01", "root", gpu=5, mib=4096, name="sglang-worker-of-root")

    check = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "nobody",
                "--check")
    assert "scope: only user nobody's processes are signalled" in check.out
    assert "sglang-worker-of-nobody" in check.out
    assert "sglang-worker-of-root" not in check.out
    assert alive(fleet, "node01", [theirs, roots]) == [theirs, roots]

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "nobody", *FAST,
              "--json")
    assert alive(fleet, "node01", [theirs, roots]) == [roots]
    host = res.host("node01")
    assert [s["pid"] for s in host["signalled"]] == [theirs]
    # root's GPU is still in use: the verification still judges every GPU.
    assert host["status"] == "dirty"
    assert fleet.gpu_used_mib("node01") == [0, 0, 0, 0, 0, 4096, 0, 0]
    assert records.load_record("-1")["scope"] == {"user": "nobody", "slurm_job": False}

    # A UID works as well as a name; a user the host does not know is refused there.
    unknown = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user",
                  "no-such-user", *FAST, "--json")
    assert unknown.code == 2
    assert "--user no-such-user: no such user on this host" in unknown.host("node01")["error"]
    assert alive(fleet, "node01", [roots]) == [roots]
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "0", *FAST,
              "--json")
    assert res.code == 0, res.out
    assert alive(fleet, "node01", [roots]) == []


def test_a_bad_user_is_refused_before_anything_is_sent(cli: Cli, tmp_path: Path) -> None:
    res = cli("run", "post-extraction", "-i", "gpu01,", "--user", "alice; rm -rf /")
    assert res.code == 4
    assert "--user 'alice; rm -rf /' is not a user name or a UID" in res.err
