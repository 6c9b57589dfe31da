"""The simulator behaves like real nodes: persistenced, padded titles, leaks and resets,
zombies, inference-engine trees, faulty GPUs and slow sshd (issue #12).

Every fleet is taken down by PID whatever happens (tests/conftest.py; the CLI-started one
in ``finally``). Assertions read /proc or run the fake nvidia-smi inside the node.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
Factory = Callable[..., SimFleet]
USED = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
APPS = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]


def smi(fleet: SimFleet, *args: str) -> subprocess.CompletedProcess[str]:
    return fleet.run_in("node01", ["nvidia-smi", *args])


def used(fleet: SimFleet) -> list[int]:
    return [int(v) for v in fleet.run_in("node01", USED).stdout.split()]


def apps(fleet: SimFleet) -> set[int]:
    return {int(p) for p in fleet.run_in("node01", APPS).stdout.split()}


def holders(fleet: SimFleet, device: str) -> set[int]:
    return {int(p) for p in fleet.run_in("node01", ["fuser", device]).stdout.split()}


def state(fleet: SimFleet, pid: int) -> str:
    stat = fleet.node_path("node01", f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rindex(b")") + 2 :].split()[0].decode()


def comm(fleet: SimFleet, pid: int) -> str:
    return fleet.node_path("node01", f"/proc/{pid}/comm").read_text().strip()


def cmdline(fleet: SimFleet, pid: int) -> bytes:
    return fleet.node_path("node01", f"/proc/{pid}/cmdline").read_bytes()


def test_sim_up_runs_persistenced_holding_every_gpu_with_no_memory(
    tmp_path: Path, sim_subnet: int
) -> None:
    state_dir = tmp_path / "fleet"
    base = [sys.executable, "-m", "fleetclean", "sim"]
    try:
        up = subprocess.run(
            [
                *base,
                "up",
                "--nodes",
                "1",
                "--state-dir",
                str(state_dir),
                "--subnet",
                str(sim_subnet),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert up.returncode == 0, up.stderr
        fleet = SimFleet.load(state_dir)
        daemon = fleet.persistenced_pid("node01")
        assert daemon is not None and comm(fleet, daemon) == "nvidia-persiste"
        # The node's own daemon, like its init and sshd: not a workload.
        assert fleet.processes("node01") == []
        assert [p.pid for p in fleet.processes("node01", include_system=True)].count(daemon) == 1
        for device in [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl"]:
            assert daemon in holders(fleet, device), device
        assert used(fleet) == [0] * 8
        assert apps(fleet) == set()
        assert smi(fleet, "-pm", "0", "-i", "3").returncode == 0
        assert daemon not in holders(fleet, "/dev/nvidia3")
        assert daemon in holders(fleet, "/dev/nvidia2")
        modes = smi(fleet, "--query-gpu=persistence_mode", "--format=csv,noheader").stdout
        assert modes.split("\n")[2:5] == ["Enabled", "Disabled", "Enabled"]
        assert smi(fleet, "-pm", "1", "-i", "3").returncode == 0
        assert daemon in holders(fleet, "/dev/nvidia3")
    finally:
        subprocess.run([*base, "down", "--state-dir", str(state_dir)], check=False)


def test_titled_workers_leave_their_argv_area_as_nul_padding(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    _, worker, *_ = fleet.spawn("node01", "sglang", gpus="0-1")
    raw = cmdline(fleet, worker)
    assert raw.startswith(b"sglang::scheduler_TP0\0")
    assert len(raw) > 100 and set(raw[len("sglang::scheduler_TP0") :]) == {0}
    assert {p.cmdline for p in fleet.processes("node01")} >= {"sglang::scheduler_TP0"}
    lib = next(Path("fleetclean").rglob("stages/lib.sh")).resolve()
    done = fleet.run_in(
        "node01", ["bash", "-c", f'. {lib}; fc_cmdline {worker}; printf "%s|" "$REPLY"']
    )
    assert done.stdout == "sglang::scheduler_TP0|"


def test_leak_is_freed_only_by_a_reset_nobody_blocks(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    fleet.set_fault("node01", "leak", 5, 512)
    daemon = fleet.persistenced_pid("node01")
    (holder,) = fleet.spawn("node01", "stubborn", gpu=5, mib=1000)
    assert used(fleet)[5] == 1512 and apps(fleet) == {holder}
    refused = smi(fleet, "--gpu-reset", "-i", "5")
    assert refused.returncode == 255
    assert "GPU 00000000:AB:00.0: In use by another client" in refused.stdout
    fleet.run_in("node01", ["kill", "-KILL", str(holder)])
    assert used(fleet)[5] == 512 and apps(fleet) == set()
    # The strict driver counts nvidia-persistenced's handle; persistence off frees it.
    assert smi(fleet, "-r", "-i", "5").returncode == 255
    assert smi(fleet, "-pm", "0", "-i", "5").returncode == 0
    done = smi(fleet, "-r", "-i", "5")
    assert (done.returncode, done.stdout) == (0, "GPU 00000000:AB:00.0 was successfully reset.\n")
    assert used(fleet)[5] == 0
    assert daemon in holders(fleet, "/dev/nvidiactl")
    nobody = fleet.run_in("node01", ["setpriv", "--reuid=65534", "nvidia-smi", "-r", "-i", "5"])
    assert nobody.returncode == 4


def test_lenient_driver_resets_beside_persistenced(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    fleet.set_fault("node01", "leak", 2, 300)
    fleet.set_fault("node01", "reset-policy", "lenient")
    assert smi(fleet, "-r", "-i", "2").returncode == 0
    assert used(fleet) == [0] * 8


def test_killed_worker_of_a_neglectful_parent_stays_defunct(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    parent, worker0, worker1 = fleet.spawn("node01", "zombie-parent", gpus="0,1", mib=4096)
    assert used(fleet)[:2] == [4096, 4096]
    fleet.run_in("node01", ["kill", "-KILL", str(worker0)])
    # SIGKILL is delivered at once but the exit completes a moment later, under load later.
    deadline = time.monotonic() + 10
    while state(fleet, worker0) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    listing = fleet.run_in("node01", ["ps", "-o", "pid=,stat=,args=", "-p", str(worker0)])
    assert "Z" in listing.stdout and "<defunct>" in listing.stdout
    assert state(fleet, worker0) == "Z" and state(fleet, parent) == "S"
    assert used(fleet)[:2] == [0, 4096] and apps(fleet) == {worker1}


ENGINE_TREES = {
    "vllm": ("python3", ["VLLM::EngineCor", "VLLM::Worker_TP", "VLLM::Worker_TP"]),
    "trtllm": ("trtllm-serve", ["python3"]),
    "triton": ("tritonserver", []),
    "tgi": ("text-generation", ["text-generation", "text-generation", "text-generation"]),
    "ray": ("ray", ["gcs_server", "raylet", "ray::RayWorkerW", "ray::RayWorkerW", "ray::IDLE"]),
}


@pytest.mark.parametrize("kind", sorted(ENGINE_TREES))
def test_engine_trees_hold_gpus_like_the_real_ones(sim_fleet_factory: Factory, kind: str) -> None:
    fleet = sim_fleet_factory(1)
    root, *rest = fleet.spawn("node01", kind, gpus="2,3", mib=30000)
    root_comm, comms = ENGINE_TREES[kind]
    assert comm(fleet, root) == root_comm
    assert [comm(fleet, pid) for pid in rest] == comms
    assert used(fleet) == [0, 0, 30000, 30000, 0, 0, 0, 0]
    if kind == "vllm":
        titles = [p.cmdline for p in fleet.processes("node01")][1:]
        assert titles == ["VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    first = cmdline(fleet, root).split(b"\0")
    assert {
        "vllm": b"vllm.entrypoints.openai.api_server",
        "trtllm": b"/usr/local/bin/trtllm-serve",
        "triton": b"--model-repository=/models/Llama-3.1-70B-Instruct",
        "tgi": b"--num-shard",
        "ray": b"start",
    }[kind] in first
    fleet.run_in("node01", ["kill", "-TERM", str(root)])
    assert wait(lambda: used(fleet) == [0] * 8 and not fleet.processes("node01"))


def wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_faulty_gpus_give_the_real_messages_and_statuses(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    query = ["--query-gpu=index,memory.used", "--format=csv,noheader"]
    fleet.set_fault("node01", "driver")
    done = smi(fleet, *query)
    assert done.returncode == 9 and "couldn't communicate with the NVIDIA driver" in done.stdout
    fleet.set_fault("node01", "nodevices")
    assert (smi(fleet).returncode, smi(fleet).stdout) == (6, "No devices were found\n")
    fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "lost", 5)
    done = smi(fleet, *query)
    lines = done.stdout.splitlines()
    assert done.returncode == 15 and len(lines) == 8 and lines[4] == "4, 0 MiB"
    assert lines[5] == (
        "Unable to determine the device handle for GPU0000:AB:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU"
    )
    fleet.set_fault("node01", "none")
    for fault, code, words in (("power", 8, "Insufficient External Power"),
                               ("irq", 10, "Interrupt request issue")):
        fleet.set_fault("node01", fault, 1)
        done = smi(fleet, *query)
        assert done.returncode == code and done.stdout.splitlines()[1] == (
            f"Unable to determine the device handle for GPU0000:2A:00.0: {words}")
        fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "inforom", 2)
    done = smi(fleet, *query)
    assert done.returncode == 14
    assert done.stdout.startswith("WARNING: infoROM is corrupted at gpu 0000:3A:00.0\n0, 0 MiB")
    fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "fewer")
    assert len(smi(fleet, *query).stdout.splitlines()) == 7
    fleet.set_fault("node01", "remapped-pending", 1)
    fleet.set_fault("node01", "retired-pending", 6)
    pages = smi(
        fleet,
        "--query-gpu=index,retired_pages.pending,remapped_rows.pending",
        "--format=csv,noheader",
    ).stdout.splitlines()
    # An H200 retires no pages: [N/A] as the real one prints, but where the fault says Yes.
    assert pages[1] == "1, [N/A], Yes" and pages[6] == "6, Yes, No"
    assert pages[0] == "0, [N/A], No"
    bad = smi(fleet, "--query-gpu=remapped_rows.bogus", "--format=csv")
    assert bad.returncode == 2
    fleet.set_fault("node01", "xid", 79, 0)
    log = fleet.run_in("node01", ["sh", "-c", "dmesg | grep Xid"]).stdout
    assert "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>'" in log
    assert log.rstrip().endswith("GPU has fallen off the bus.")
    fleet.set_fault("node01", "none")
    assert smi(fleet, *query).returncode == 0
    # Cleared faults leave the boot's messages, a real node's 160 KB (never an empty log),
    # and no Xid; dmesg -C empties the buffer as the real one does.
    log = fleet.run_in("node01", ["dmesg"]).stdout
    assert len(log) > 150_000 and "Xid" not in log and "NVRM: loading NVIDIA" in log
    # Formatted as dmesg prints the kernel's records: the level is not shown.
    assert log.startswith("[    0.000000] Linux version") and "\n<" not in log
    fleet.run_in("node01", ["dmesg", "-C"])
    assert fleet.run_in("node01", ["dmesg"]).stdout == ""


def test_nvml_and_gpu_handle_faults_give_the_real_lines_inside_a_node(
    sim_fleet_factory: Factory,
) -> None:
    """Set as ``fleetclean sim fault`` sets them, read by the node's own nvidia-smi."""
    fleet = sim_fleet_factory(1)
    query = ["--query-gpu=index,memory.used", "--format=csv,noheader"]
    fleet.set_fault("node01", "nodevices", 0)  # versions that exit 0
    assert (smi(fleet, *query).returncode, smi(fleet).stdout) == (0, "No devices were found\n")
    fleet.set_fault("node01", "nosupported")
    done = smi(fleet, *query)
    assert (done.returncode, done.stdout) == (
        255, "Failed to initialize NVML: No supported GPUs were found\n")
    fleet.set_fault("node01", "nvml")
    done = smi(fleet, *query)
    assert (done.returncode, done.stdout.splitlines()) == (
        18, ["Failed to initialize NVML: Driver/library version mismatch",
             "NVML library version: 580.159"])
    fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "unknown", 3)
    done = smi(fleet, *query)
    lines = done.stdout.splitlines()
    assert done.returncode == 255 and len(lines) == 8 and lines[4] == "4, 0 MiB"
    assert lines[3] == "Unable to determine the device handle for GPU0000:5D:00.0: Unknown Error"
    fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "badvalue", 6, "reset")
    done = smi(fleet, "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader")
    assert done.returncode == 0
    assert done.stdout.splitlines()[5:7] == [
        "5, 0 MiB, 143771 MiB", "6, [GPU requires reset], [GPU requires reset]"]
    fleet.set_fault("node01", "none")
    assert smi(fleet, *query).returncode == 0


def banner_within(address: str, seconds: float) -> bytes:
    """What sshd sent on a fresh connection within ``seconds`` (b"" if nothing)."""
    with socket.create_connection((address, 22), timeout=seconds) as sock:
        try:
            return sock.recv(256)
        except TimeoutError:
            return b""


def ssh_true(fleet: SimFleet, timeout: float) -> int | None:
    """ssh's exit status, or None if it had not finished within ``timeout`` seconds."""
    argv = ["ssh", "-F", str(fleet.ssh_config_path), "node01", "true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        return None


def test_slow_and_stalling_sshd(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    address = fleet.node("node01").address
    fleet.set_fault("node01", "slow-banner", 60)
    assert banner_within(address, 1.0) == b""
    fleet.set_fault("node01", "stall")
    assert banner_within(address, 5.0).startswith(b"SSH-2.0-OpenSSH")
    assert ssh_true(fleet, 3.0) is None
    fleet.set_fault("node01", "slow-auth", 60)
    assert banner_within(address, 5.0).startswith(b"SSH-2.0-OpenSSH")
    assert ssh_true(fleet, 3.0) is None
    fleet.set_fault("node01", "slow-auth", 0.5)
    assert ssh_true(fleet, 30.0) == 0
    fleet.set_fault("node01", "none")
    assert fleet.listener_mode("node01") == "sshd"
    assert ssh_true(fleet, 30.0) == 0
