"""GPU minors that differ from the index order: nvidia-smi counts GPUs in bus order, the
device files are named by minor number, and the driver's /proc file says which is which."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, alive, spawn_holder, wait_for

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
MINORS = [3, 2, 1, 0, 7, 6, 5, 4]


def test_a_gpu_held_through_its_minor_shows_at_its_index_and_proc_names_the_minor(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    fleet = sim_fleet_factory(1, gpu_minors=MINORS)
    (pid,) = fleet.spawn("node01", "stubborn", gpu=1, mib=2048)
    assert fleet.gpu_used_mib("node01") == [0, 2048, 0, 0, 0, 0, 0, 0]
    fds = fleet.run_in("node01", ["ls", "-l", f"/proc/{pid}/fd"]).stdout
    assert "-> /dev/nvidia2" in fds and "-> /dev/nvidia1" not in fds
    smi = fleet.run_in("node01", ["nvidia-smi", "--query-gpu=index,pci.bus_id",
                                  "--format=csv,noheader"]).stdout.splitlines()
    for line in smi:
        index, bus = (w.strip() for w in line.split(","))
        info = fleet.run_in("node01", ["cat", f"/proc/driver/nvidia/gpus/{bus[4:].lower()}"
                                       "/information"]).stdout
        assert f"Device Minor: \t {MINORS[int(index)]}\n" in info
    device = fleet.run_in("node01", ["stat", "-c", "%F", "/dev/nvidia2"]).stdout.strip()
    assert device == "character special file"  # what Slurm's gres.conf File= requires


def test_a_device_file_holder_is_named_under_the_gpu_its_minor_is(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    # GPU5 leaks 512 MiB and no compute app explains it: the verification looks for the
    # holders of its device file, /dev/nvidia2 here, and names them under GPU5.
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    fleet.set_fault("node01", "leak", 5, 512)
    # An NVML user (no CUDA context, no memory of its own) with GPU5's device file open.
    pid = spawn_holder(fleet, "node01", 0, 0, gpu=5, mib=0, name="nvml-agent", cuda=False)
    fds = fleet.node_path("node01", f"/proc/{pid}/fd")
    wait_for("the holder's open /dev/nvidia2",
             lambda: "/dev/nvidia2" in {os.readlink(fds / fd) for fd in os.listdir(fds)}, 30)

    host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert host["status"] == "dirty"
    named = {g["index"]: [p["pid"] for p in g["processes"] if p["source"] == "device-file"]
             for g in host["gpus"]}
    assert pid in named[5] and not [i for i, pids in named.items() if pid in pids and i != 5]
    assert f"{pid} python3 (no CUDA context)" in host["error"], host["error"]


def test_a_teardown_that_reads_the_gpus_as_csv_finds_a_listed_holder_by_its_minor(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    # A retirement pending on GPU3 sends the -q read to the CSV queries, which give no
    # minor. The holder nvidia-smi lists on GPU1 has only GPU1's file open, /dev/nvidia6:
    # gpu-holders must check that file, not /dev/nvidia1 (the index), or it signals nobody.
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    fleet.set_fault("node01", "retired-pending", 3)
    pid = spawn_holder(fleet, "node01", 0, 0, gpu=1, mib=2048, name="csv-read-holder")
    playbook = tmp_path / "holders.yaml"
    playbook.write_text("name: holders\nstages:\n  - name: kill-gpu-holders\n"
                        "    type: gpu-holders\n    grace: 1\n")
    res = cli("run", playbook, "-i", fleet.inventory_path, "--json").host("node01")
    assert [s["pid"] for s in res["signalled"]] == [pid], res
    wait_for("the holder's end", lambda: not alive(fleet, "node01", [pid]), 30)
