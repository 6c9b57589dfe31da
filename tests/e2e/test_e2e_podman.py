"""Podman containers as owners over SSH (item 65): a container a GPU server runs in with
``--restart=always``, root's or a user's (rootless), is stopped with ``podman stop`` as
the user whose podman runs it, not signalled (its conmon's exit command would start it
again); its GPUs read 0 MiB and it stays stopped; a container beside it that holds no GPU
keeps running.

One one-node fleet for the module; each test leaves the node idle: what it started is
stopped through podman, as its own user.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from simhelp import Cli, sh, user_namespace_refusal
from slurmhelp import wait_for

from fleetclean.sim import SimFleet, accounts
from fleetclean.sim import cgroups as sim_cgroups

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(sim_cgroups.plan("probe").mode == "none",
                       reason=f"no writable cgroup hierarchy: {sim_cgroups.plan('probe').why}"),
]
ALICE = accounts.user("alice").uid
ALICE_PODMAN = f"runuser -u alice -- env XDG_RUNTIME_DIR=/run/user/{ALICE} podman"


@pytest.fixture
def fleet(shared: SimFleet) -> Iterator[SimFleet]:
    yield shared
    # Through podman, as each container's user: one killed by PID would come back.
    for podman in ("podman", ALICE_PODMAN):
        sh(shared, f"if command -v podman >/dev/null; then {podman} ps -q | "
                   f"xargs -r {podman} stop -t 0 >/dev/null; fi")
    assert wait_for(lambda: shared.gpu_used_mib("node01") == [0] * 8)


def running(fleet: SimFleet, pids: list[int]) -> list[int]:
    out = sh(fleet, "ps -eo pid=").split()
    return [p for p in pids if str(p) in out]


def run(cli: Cli, fleet: SimFleet) -> tuple[int, dict[str, Any]]:
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    return done.code, done.host("node01")


def stopped_through_podman(fleet: SimFleet, cli: Cli, podman: str, name: str,
                           main: int) -> None:
    cid = sh(fleet, f"{podman} inspect --format '{{{{.Id}}}}' {name}")
    # A kill would not do: its conmon's exit command starts it again.
    assert sh(fleet, f"cat /proc/{main}/cgroup").endswith(f"/libpod-{cid}.scope")
    (keep,) = fleet.spawn("node01", "podman", container=f"{name}-keep", run="monitor",
                          restart="always")
    code, host = run(cli, fleet)
    assert (code, host["status"], host["warnings"]) == (0, "clean", []), host
    assert {s["pid"]: s["signal"] for s in host["signalled"]} == {main: "stop"}
    assert {s["pid"]: s["owner"] for s in host["signalled"]} == {
        main: {"kind": "podman", "id": cid, "name": cid[:12]}}
    assert sh(fleet, f"{podman} inspect --format '{{{{.State.Status}}}} {{{{.RestartCount}}}}' "
                     f"{name}") == "exited 0"
    time.sleep(1.5)  # a restart by its policy is at once
    assert running(fleet, [main, keep]) == [keep]
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert sh(fleet, f"podman inspect --format '{{{{.State.Status}}}}' {name}-keep") == "running"


def test_a_rootful_podman_container_with_restart_always_is_stopped_through_podman(
    fleet: SimFleet, cli: Cli
) -> None:
    (main,) = fleet.spawn("node01", "podman", container="t-pod", restart="always", gpus="2",
                          mib=2048)
    stopped_through_podman(fleet, cli, "podman", "t-pod", main)


def test_a_rootless_podman_container_is_stopped_by_its_users_podman(
    fleet: SimFleet, cli: Cli
) -> None:
    # Alice's own podman runs it (her store in /run/user/UID); root's knows nothing of it.
    refusal = user_namespace_refusal()
    if refusal:
        pytest.skip(refusal)
    if fleet.cgroup_mode != "v2":
        pytest.skip(f"rootless podman's cgroups need cgroup v2, not {fleet.cgroup_mode}")
    (main,) = fleet.spawn("node01", "podman", container="t-less", rootless="alice",
                          restart="always", gpus="5", mib=2048)
    assert sh(fleet, f"ps -o user= -p {main}") == "alice"
    unknown = fleet.run_in("node01", ["podman", "stop", "t-less"])
    assert (unknown.returncode, unknown.stderr.strip()) == (
        125, 'Error: no container with name or ID "t-less" found: no such container')
    stopped_through_podman(fleet, cli, ALICE_PODMAN, "t-less", main)


def test_a_container_podman_restart_service_brought_back_is_podmans_not_the_units(
    fleet: SimFleet, cli: Cli
) -> None:
    # At boot podman-restart.service (a oneshot unit, RemainAfterExit) runs `podman start
    # --all`: INVOCATION_ID set, podman leaves each conmon in the unit's cgroup. The
    # container is still podman's to stop; the unit (MainPID 0, every container's) is not.
    (main,) = fleet.spawn("node01", "podman", container="t-boot", restart="always", gpus="3",
                          mib=2048, unit="podman-restart.service")
    conmon = sh(fleet, "podman inspect --format '{{.State.ConmonPid}}' t-boot")
    assert sh(fleet, f"cat /proc/{conmon}/cgroup").endswith("/podman-restart.service")
    try:
        stopped_through_podman(fleet, cli, "podman", "t-boot", main)
        assert sh(fleet, "systemctl show -p ActiveState --value podman-restart.service") == (
            "active")
    finally:
        sh(fleet, "systemctl stop podman-restart.service")
