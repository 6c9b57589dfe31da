"""A simulated node's /sys/module/nvidia_uvm/refcnt follows its CUDA processes as a real
node's kernel count does (``sim/uvm_count.py``): up once each has /dev/nvidia-uvm open, not
for an NVML reader, still up while a killed one waits in the driver, and back to 0 once the
last one's files are closed. A status script picks its GPU read by it (render.early_reads)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from simhelp import wait_for

from fleetclean.sim import SimFleet, uvm_count

pytestmark = pytest.mark.sim


def test_the_count_is_each_cuda_process_from_its_start_to_its_end(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    fleet = sim_fleet_factory(2)  # nvidia-persistenced on every GPU, by default

    def count(node: str = "node01") -> str:
        return fleet.node_path(node, uvm_count.REFCNT).read_text()

    def state(pid: int) -> str:
        return fleet.run_in("node01", ["cat", f"/proc/{pid}/stat"]).stdout.split(") ")[-1][:1]

    assert count() == "0\n"
    # Counted by the time spawn returns (each worker ready once its files are open).
    workers = fleet.spawn("node01", "sglang", gpus="0-3", mib=1024)
    assert count() == "4\n" and count("node02") == "0\n"
    # nvidia-persistenced and a monitoring agent hold GPUs' files, never /dev/nvidia-uvm:
    # counted anew beside them (at the next CUDA process's start), they are not counted.
    fleet.spawn("node01", "monitor")
    # A process whose main thread has ended (a zombie leader) while another holds its
    # files is counted through that thread.
    leaderless = fleet.spawn("node01", "pthread-exit", gpu=4, mib=1024, thread="work")
    wait_for("its main thread ended", lambda: state(leaderless[0]) == "Z")
    stuck = fleet.spawn("node01", "stuck", gpu=5, mib=2048)
    assert count() == "6\n"
    fleet.run_in("node01", ["kill", "-9", *map(str, workers + leaderless)])
    wait_for("the workers' files closed", lambda: count() == "1\n")
    # Killed, the stuck one waits in the driver (state D) with its files open: counted.
    fleet.run_in("node01", ["kill", "-9", str(stuck[0])])
    wait_for("the stuck one in state D", lambda: state(stuck[0]) == "D")
    assert count() == "1\n"
    fleet.set_fault("node01", "unstick")
    wait_for("the stuck one gone", lambda: count() == "0\n")
