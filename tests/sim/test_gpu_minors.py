"""GPU minors that differ from the index order: nvidia-smi counts GPUs in bus order, the
device files are named by minor number, and the driver's /proc file says which is which."""

from __future__ import annotations

from collections.abc import Callable

import pytest

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
