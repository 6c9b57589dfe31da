"""A wedged GPU driver (after an Xid 79 or 119, say): nvidia-smi never answers, and SIGKILL
leaves it in state D (the simulator's fault ``hang``: the node's fake nvidia-smi waits on
its stuck driver, ``sim/stuckfs.py``, where the kernel's wait is real). The host is
``faulty`` once ``smi_timeout`` has passed, in words that say so, its neighbours are read
as ever, and what stays in the driver holds neither the session nor the host's lock.
Before, a status waited for it until ``--timeout`` (300 s by default) and said "script
still running"; a teardown's left the lock held for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from simhelp import Cli, is_script

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
SMI = "nvidia_smi.py"  # the fake's command line (its comm reads nvidia-smi, as the real one's)


@pytest.fixture
def wedged(sim_fleet_factory) -> Iterator[SimFleet]:  # type: ignore[no-untyped-def]
    """Two nodes, node01's driver wedged; unwedged at the end (its stuck calls fail)."""
    fleet = sim_fleet_factory(2)
    fleet.set_fault("node01", "hang")
    try:
        yield fleet
    finally:
        fleet.set_fault("node01", "none")
        fleet.set_fault("node01", "unstick")


def state(fleet: SimFleet, node: str, pid: int) -> str:
    stat = fleet.node_path(node, f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def left_in_driver(fleet: SimFleet) -> list[int]:
    return [p.pid for p in fleet.processes("node01") if SMI in p.cmdline]


def test_a_status_says_the_driver_is_hung_and_reads_the_other_hosts(
        wedged: SimFleet, cli: Cli, tmp_path: Path) -> None:
    fleet = wedged
    fleet.spawn("node02", "sglang", gpus="0-1")
    res = cli("status", "-i", fleet.inventory_path, "--json", "-e", "smi_timeout=2",
              "--timeout", "20")
    hosts = {h["host"]: h for h in res.json()["hosts"]}
    hung = hosts["node01"]
    assert hung["status"] == "faulty", hung
    assert hung["error"].startswith("nvidia-smi did not answer in 2s (smi_timeout): PID "), hung
    assert "outlived SIGKILL, waiting in the GPU driver (state D)" in hung["error"], hung
    assert hosts["node02"]["status"] == "dirty"
    assert [g["memory_used_mib"] > 0 for g in hosts["node02"]["gpus"]][:3] == [True, True, False]
    assert res.code == 1
    # What stays is the nvidia-smi the driver holds, killed and waiting (state D): the
    # script is gone, so the session ended.
    stuck = left_in_driver(fleet)
    assert len(stuck) == 1 and state(fleet, "node01", stuck[0]) == "D"
    assert not [p for p in fleet.processes("node01") if is_script(p.cmdline)]
    # The next status (a --watch's refresh, a cron's) starts none to leave there too: the
    # first one's note names it, still in the driver. The table says it in one line.
    table = cli("status", "-i", fleet.inventory_path, "-l", "node01", "-e", "smi_timeout=1")
    assert table.code == 1
    assert (f"node01: faulty: nvidia-smi did not answer: PID {stuck[0]}, an earlier run's, "
            "still waits in the GPU driver (state D), so none was started") in table.out
    assert left_in_driver(fleet) == stuck
    # A login other than root reads root's note as well.
    data = yaml.safe_load(fleet.inventory_path.read_text())
    data["all"]["hosts"]["node01"]["ansible_user"] = "bob"
    inventory = tmp_path / "bob.yaml"
    inventory.write_text(yaml.safe_dump(data))
    inventory.chmod(0o600)
    bobs = cli("status", "-i", inventory, "-l", "node01", "--json", "-e", "smi_timeout=1")
    host = bobs.json()["hosts"][0]
    assert host["status"] == "faulty" and "an earlier run's" in host["error"], host
    assert left_in_driver(fleet) == stuck


def test_a_teardown_stops_the_server_and_leaves_the_lock_free(
        wedged: SimFleet, cli: Cli) -> None:
    fleet = wedged
    server = fleet.spawn("node01", "sglang", gpus="0-7")
    args = ["run", "post-extraction", "-i", str(fleet.inventory_path), "-l", "node01",
            "--json", "-e", "grace=1", "-e", "smi_timeout=2", "--timeout", "20"]
    first = cli(*args)
    host = first.json()["hosts"][0]
    assert host["status"] == "faulty" and "state D" in host["error"], host
    # The server and its workers were stopped all the same (the stages read /proc).
    running = {p.pid for p in fleet.processes("node01")}
    assert not running & set(server)
    # A second run takes the host's lock: the first one's nvidia-smi, left in the driver,
    # does not hold it (it ran without the lock's descriptor).
    second = cli(*args, "-e", "lock_wait=1")
    again = second.json()["hosts"][0]
    assert again["status"] == "faulty" and "host busy" not in (again["error"] or ""), again
    # ... and starts no nvidia-smi of its own, which would be left in the driver too.
    assert "an earlier run's" in again["error"] and len(left_in_driver(fleet)) == 1, again
    # The driver answers again: its stuck calls end, and the host reads clean; the note
    # of the one left there goes.
    fleet.set_fault("node01", "none")
    fleet.set_fault("node01", "unstick")
    note = fleet.node_path("node01", "/run/fleetclean-smi-stuck")
    assert note.exists()
    after = cli("status", "-i", fleet.inventory_path, "-l", "node01", "--json")
    assert after.json()["hosts"][0]["status"] == "clean"
    assert left_in_driver(fleet) == [] and not note.exists()


def test_gpus_that_answer_and_processes_that_do_not_are_still_a_hung_driver(
        sim_fleet_factory, cli: Cli) -> None:  # type: ignore[no-untyped-def]
    """A host read clean last time reads its GPUs alone first (the --query-gpu pdsh users
    type) and asks for their processes only once one is in use: here the GPUs answer and
    that second call does not. It was read dirty, its holders guessed from device files."""
    fleet = sim_fleet_factory(1)
    args = ["status", "-i", str(fleet.inventory_path), "--json", "-e", "smi_timeout=2",
            "--timeout", "20"]
    assert cli(*args).json()["hosts"][0]["status"] == "clean"
    fleet.spawn("node01", "sglang", gpus="0-1")
    fleet.set_fault("node01", "hang", "apps")
    try:
        host = cli(*args).json()["hosts"][0]
        assert host["status"] == "faulty", host
        assert "did not answer in 2s (smi_timeout)" in host["error"] and "state D" in host["error"]
        # Its GPUs were read: the rows are there.
        assert [g["memory_used_mib"] > 0 for g in host["gpus"]][:3] == [True, True, False], host
    finally:
        fleet.set_fault("node01", "none")
        fleet.set_fault("node01", "unstick")


def test_a_run_scoped_to_gpus_on_a_hung_driver_is_faulty_and_signals_nobody(
        wedged: SimFleet, cli: Cli) -> None:
    """--gpus (an epilog's job GPUs alike) needs nvidia-smi to tell the GPUs apart. On a
    hung driver it cannot, so the run signals nobody, as where the GPUs are unknown, and
    says the driver is hung. It said `error`, "cannot tell this host's GPUs apart"."""
    fleet = wedged
    server = fleet.spawn("node01", "sglang", gpus="0-1")
    args = ["run", "post-extraction", "-i", str(fleet.inventory_path), "-l", "node01",
            "--gpus", "0,1", "--json", "-e", "grace=1", "-e", "smi_timeout=2",
            "--timeout", "20"]
    host = cli(*args).json()["hosts"][0]
    assert host["status"] == "faulty", host
    assert host["error"].startswith("nvidia-smi did not answer in 2s (smi_timeout): "), host
    assert "(state D)" in host["error"] and host["signalled"] == [], host
    running = {p.pid for p in fleet.processes("node01")}
    assert set(server) <= running
    status = cli("status", "-i", fleet.inventory_path, "--gpus", "1", "--json",
                 "-e", "smi_timeout=1", "--timeout", "20").json()["hosts"]
    assert status[0]["status"] == "faulty" and "(state D)" in status[0]["error"], status
    assert status[1]["status"] == "clean", status
