"""True diagnosis over SSH on nodes that behave like real ones (issue #12 items 1, 2, 6):
who holds a dirty GPU, driver-level leaks ended by their own rule, and faulty GPUs.

Every node runs nvidia-persistenced holding every GPU, as on a datacenter node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, alive, edit_inventory

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
Factory = Callable[..., SimFleet]


def with_persistenced(factory: Factory) -> tuple[SimFleet, int]:
    fleet = factory(1)
    (daemon,) = fleet.spawn("node01", "persistenced", devices="all")
    return fleet, daemon


def test_reason_names_the_unkillable_worker_and_not_persistenced(
    sim_fleet_factory: Factory, cli: Cli
) -> None:
    fleet, daemon = with_persistenced(sim_fleet_factory)
    (hog,) = fleet.spawn("node01", "stubborn", gpu=3, mib=1000, name="gpuhog --gpu 3")
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "protect=gpuhog",
               "-e", "verify_timeout=1", "--json")
    host = done.host("node01")
    assert done.code == 1 and host["status"] == "dirty"
    assert f"held by {hog} gpuhog --gpu 3 (root; GPU3; protected)" in host["error"]
    assert "persistenced" not in host["error"]
    assert host["gpus"][3]["processes"] == [{
        "pid": hog, "user": "root", "cmdline": "gpuhog --gpu 3", "used_mib": 1000,
        "protected": "protected name", "source": "compute-app"}]
    assert all(g["processes"] == [] for g in host["gpus"] if g["index"] != 3)
    assert alive(fleet, "node01", [hog, daemon]) == [hog, daemon]


def test_titled_workers_are_named_once_each_with_their_gpus(
    sim_fleet_factory: Factory, cli: Cli
) -> None:
    fleet, _ = with_persistenced(sim_fleet_factory)
    _, worker0, worker1, *_ = fleet.spawn("node01", "sglang", gpus="0-1", mib=4096)
    done = cli("status", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert host["status"] == "dirty"
    assert f"held by {worker0} sglang::scheduler_TP0 (root; GPU0)" in host["error"]
    assert f"{worker1} sglang::scheduler_TP1 (root; GPU1)" in host["error"]
    (proc,) = host["gpus"][0]["processes"]
    assert proc["cmdline"] == "sglang::scheduler_TP0" and proc["used_mib"] == 4096
    assert "persistenced" not in host["error"]


def test_leak_ends_the_verification_by_the_leak_rule_and_names_the_gpu(
    sim_fleet_factory: Factory, cli: Cli
) -> None:
    fleet, daemon = with_persistenced(sim_fleet_factory)
    fleet.set_fault("node01", "leak", 5, 512)
    fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
    done = cli("run", "post-extraction", "-i", fleet.inventory_path,
               "-e", "verify_timeout=120", "--json")
    host = done.host("node01")
    assert done.code == 1 and host["status"] == "dirty"
    assert host["verify"] == {"rule": "leak"}
    assert ("GPU5: 512 MiB held by no process (driver-level leak): "
            "run nvidia-smi --gpu-reset -i 5 or reboot") in host["error"]
    assert f"only {daemon} nvidia-persistenced, protected, has it open" in host["error"]
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0] * 5 + [512, 0, 0]
    assert alive(fleet, "node01", [daemon]) == [daemon]


def test_memory_still_falling_is_not_a_leak(
    sim_fleet_factory: Factory, cli: Cli, tmp_path: Path
) -> None:
    fleet, _ = with_persistenced(sim_fleet_factory)
    fleet.set_fault("node01", "leak", 2, 4000)
    book = tmp_path / "verify-only.yaml"
    book.write_text("name: verify-only\nstages: []\n"
                    "verify:\n  max_used_mib: 0\n  timeout: 60\n  interval: 0.05\n"
                    "  leak_quiet: 3\n")
    stop = threading.Event()

    def release() -> None:  # memory freed in steps, as a dying process's is
        for mib in (3000, 2000, 1000, 0):
            if stop.wait(0.4):
                return
            fleet.set_fault("node01", "leak", 2, mib)

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        done = cli("run", book, "-i", fleet.inventory_path, "--json")
    finally:
        stop.set()
        releaser.join()
    host = done.host("node01")
    assert host["verify"] == {"rule": "clean"} and host["status"] == "clean", host


FAULTS: list[tuple[tuple[str | int, ...], str]] = [
    (("driver",), "nvidia-smi exit 9 (NVIDIA driver not loaded)"),
    (("nodevices",), "No devices were found"),
    (("inforom", 2), "nvidia-smi exit 14 (InfoROM corrupted)"),
    (("lost", 5), "nvidia-smi exit 15 (GPU fell off the bus or is lost)"),
    (("retired-pending", 6), "GPU6: retired pages pending"),
    (("remapped-pending", 1), "GPU1: remapped rows pending"),
    (("xid", 79, 0), "Xid 79 on PCI"),
]


@pytest.fixture(scope="module")
def fault_fleet(module_fleet_factory: Factory) -> SimFleet:
    fleet = module_fleet_factory(1)
    fleet.spawn("node01", "persistenced", devices="all")
    return fleet


@pytest.mark.parametrize(("fault", "reason"), FAULTS, ids=[f[0][0] for f in FAULTS])
def test_each_fault_makes_the_host_faulty_with_its_reason(
    fault_fleet: SimFleet, cli: Cli, fault: tuple[str | int, ...], reason: str
) -> None:
    fault_fleet.set_fault("node01", "none")
    fault_fleet.set_fault("node01", *fault)
    try:
        done = cli("status", "-i", fault_fleet.inventory_path, "--json")
    finally:
        fault_fleet.set_fault("node01", "none")
    host = done.host("node01")
    assert (done.code, host["status"]) == (1, "faulty"), host
    assert reason in host["error"]
    assert done.json()["summary"]["faulty"] == 1
    if fault[0] in ("lost", "inforom"):
        assert len(host["gpus"]) == (7 if fault[0] == "lost" else 8)


def test_fewer_gpus_than_expected_or_than_last_seen_is_faulty(
    fault_fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    fault_fleet.set_fault("node01", "none")
    inventory = edit_inventory(fault_fleet, tmp_path / "inv.yaml",
                               node01={"expected_gpus": 8})
    fault_fleet.set_fault("node01", "fewer")
    try:
        by_var = cli("status", "-i", inventory, "--json").host("node01")
        never_seen = cli("status", "-i", fault_fleet.inventory_path, "--json").host("node01")
        fault_fleet.set_fault("node01", "none")
        cli("run", "pre-restart", "-i", fault_fleet.inventory_path, "--json")  # seen with 8
        fault_fleet.set_fault("node01", "fewer")
        by_record = cli("status", "-i", fault_fleet.inventory_path, "--json").host("node01")
    finally:
        fault_fleet.set_fault("node01", "none")
    assert by_var["status"] == "faulty" and "7 GPU(s) visible, 8 expected" in by_var["error"]
    assert never_seen["status"] == "clean"  # nothing known about the host: no check
    assert by_record["status"] == "faulty"


def test_application_xids_and_a_busy_node_are_never_faulty(
    fault_fleet: SimFleet, cli: Cli
) -> None:
    fault_fleet.set_fault("node01", "none")
    for code in (13, 31, 43, 45):
        fault_fleet.set_fault("node01", "xid", code, 1)
    pids = fault_fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
    try:
        done = cli("status", "-i", fault_fleet.inventory_path, "--json")
    finally:
        fault_fleet.run_in("node01", ["kill", "-KILL", *map(str, pids)])
        fault_fleet.set_fault("node01", "none")
    host = done.host("node01")
    assert host["status"] == "dirty" and done.json()["summary"]["faulty"] == 0
