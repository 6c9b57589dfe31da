"""gpu-reset (issue #12 item 2) over SSH, on both driver behaviours: one where the
handles nvidia-persistenced keeps on every GPU block a reset (strict) and one where they
do not (lenient). A leaked GPU is reset, a held one never is, and persistence mode ends
as it began on every path: success, and a run cut off in the middle of a reset."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, is_script, spawn_cli

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
Factory = Callable[..., SimFleet]
MODES = ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader"]




def modes(fleet: SimFleet) -> list[str]:
    return fleet.run_in("node01", MODES).stdout.split()


def persistenced_holds(fleet: SimFleet, gpu: int) -> bool:
    daemon = fleet.persistenced_pid("node01")
    done = fleet.run_in("node01", ["fuser", f"/dev/nvidia{gpu}"])
    return str(daemon) in done.stdout.split()


@pytest.mark.parametrize("policy", ["strict", "lenient"])
def test_gpu_reset_clears_a_leak_and_refuses_a_held_gpu(
    fleet: SimFleet, cli: Cli, policy: str
) -> None:
    fleet.set_fault("node01", "reset-policy", policy)
    fleet.set_fault("node01", "leak", 5, 512)
    fleet.set_fault("node01", "leak", 3, 300)  # leaked too, but a protected process holds it
    (hog,) = fleet.spawn("node01", "stubborn", gpu=3, mib=1000, name="gpuhog --gpu 3")
    fleet.spawn("node01", "sglang", gpus="0-1")
    args = ("-i", fleet.inventory_path, "-e", "reset_leaked=true", "-e", "protect=gpuhog",
            "-e", "verify_timeout=1")
    check = cli("run", "post-extraction", *args, "--check")
    assert "reset-leaked: GPU5 reset: would (512 MiB held by no process)" in check.out
    assert fleet.gpu_used_mib("node01")[5] == 512  # --check changed nothing

    done = cli("run", "post-extraction", *args, "--json")
    host = done.host("node01")
    (reset,) = host["resets"]
    assert (reset["gpu"], reset["result"]) == (5, "ok")
    toggled = "persistence mode off for the reset, then on again (restored)"
    assert (toggled in reset["detail"]) == (policy == "strict"), reset
    used = fleet.gpu_used_mib("node01")
    assert used[5] == 0 and used[3] == 1300, used  # the held GPU was never reset
    assert host["status"] == "dirty" and f"held by {hog} gpuhog" in host["error"]
    assert modes(fleet) == ["Enabled"] * 8 and persistenced_holds(fleet, 5)
    table = cli("run", "post-extraction", *args)
    assert "GPU5 reset" not in table.out  # nothing leaked any more: nothing reset


def test_a_reset_interrupted_midway_still_restores_persistence(
    fleet: SimFleet, tmp_path: Path
) -> None:
    fleet.set_fault("node01", "leak", 5, 512)
    fleet.set_fault("node01", "reset-delay", 3)  # a real reset takes seconds
    controller = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(fleet.inventory_path),
                           "-e", "reset_leaked=true", "--json")
    state = fleet.node_path("node01", "/run/fleetclean/persistence.json")
    try:
        deadline = time.monotonic() + 60
        while not _off(state, 5):
            assert controller.poll() is None and time.monotonic() < deadline, "no reset began"
            time.sleep(0.02)
        # The operator stops the teardown on the node (its script, by PID) mid-reset.
        scripts = {p.pid: p.ppid for p in fleet.processes("node01") if is_script(p.cmdline)}
        (script,) = [pid for pid, parent in scripts.items() if parent not in scripts]
        fleet.run_in("node01", ["kill", "-TERM", str(script)])
        out, _ = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.send_signal(signal.SIGKILL)  # our own child, by PID
            controller.communicate()
    host = json.loads(out)["hosts"][0]
    assert "reset-leaked" in (host["error"] or ""), host  # the run says where it stopped
    assert modes(fleet) == ["Enabled"] * 8 and persistenced_holds(fleet, 5)


def _off(path: Path, gpu: int) -> bool:
    try:
        return json.loads(path.read_text()).get(str(gpu)) is False
    except (OSError, ValueError):
        return False


def test_a_held_gpu_is_told_by_its_device_minor_not_by_the_number_of_its_file(
    sim_fleet_factory: Factory, cli: Cli, tmp_path: Path
) -> None:
    """On a node whose GPU minors differ from nvidia-smi's order, GPU2's file is
    /dev/nvidia5: a job on GPU2 left GPU5's leak un-reset ("held"), as if /dev/nvidia5 were
    GPU5's."""
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    [job] = fleet.spawn("node01", "holder", gpus="2", mib=1024)
    assert " -> /dev/nvidia5\n" in fleet.run_in("node01", ["ls", "-l", f"/proc/{job}/fd"]).stdout
    fleet.set_fault("node01", "leak", 5, 512)
    playbook = tmp_path / "reset.yaml"
    playbook.write_text("name: reset\nstages:\n  - name: reset-leaked\n    type: gpu-reset\n"
                        "    quiet: 0.2\n")  # no verify: the stage needs none
    res = cli("run", str(playbook), "-i", fleet.inventory_path, "--json")
    resets = {r["gpu"]: r["result"] for r in res.host("node01")["resets"]}
    assert resets == {5: "ok"}, res.host("node01")
    assert fleet.gpu_used_mib("node01")[5] == 0 and fleet.gpu_used_mib("node01")[2] == 1024
