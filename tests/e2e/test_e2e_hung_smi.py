"""A wedged GPU driver (after an Xid 79 or 119, say): nvidia-smi never answers, and SIGKILL
leaves it in state D (the simulator's fault ``hang``: the node's fake nvidia-smi waits on
its stuck driver, ``sim/stuckfs.py``, where the kernel's wait is real). The host is
``faulty`` once ``smi_timeout`` has passed, in words that say so, its neighbours are read
as ever, and what stays in the driver holds neither the session nor the host's lock.
Before, a status waited for it until ``--timeout`` (300 s by default) and said "script
still running"; a teardown's left the lock held for good.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from simhelp import Cli, is_script, uvm_counted

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
    assert (f"node01: faulty: nvidia-smi not started: PID {stuck[0]}, left by an earlier "
            "run, waiting in the GPU driver (state D)") in table.out
    assert left_in_driver(fleet) == stuck
    # A login other than root reads root's note as well.
    bobs = cli("status", "-i", as_bob(fleet, tmp_path), "-l", "node01", "--json",
               "-e", "smi_timeout=1")
    host = bobs.json()["hosts"][0]
    assert host["status"] == "faulty" and "left by an earlier run" in host["error"], host
    assert left_in_driver(fleet) == stuck


def as_bob(fleet: SimFleet, tmp_path: Path) -> Path:
    """The fleet's inventory, node01 logged into as bob (no sudo: sim/accounts.py)."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    data["all"]["hosts"]["node01"]["ansible_user"] = "bob"
    inventory = tmp_path / "bob.yaml"
    inventory.write_text(yaml.safe_dump(data))
    inventory.chmod(0o600)
    return inventory


def test_a_login_other_than_root_leaves_one_in_the_driver_not_one_a_run(
        wedged: SimFleet, cli: Cli, tmp_path: Path) -> None:
    fleet = wedged
    args = ["status", "-i", str(as_bob(fleet, tmp_path)), "-l", "node01", "--json",
            "-e", "smi_timeout=1", "--timeout", "20"]
    first = cli(*args).json()["hosts"][0]
    assert first["status"] == "faulty" and "did not answer in 1s" in first["error"], first
    # Two, where its login may not read the kernel log: the row remapper's read then runs
    # beside the first (verify.sh: fc_verify_gate).
    stuck = left_in_driver(fleet)
    assert stuck
    for _ in range(2):
        again = cli(*args).json()["hosts"][0]
        assert again["status"] == "faulty", again
        named = re.match(r"nvidia-smi not started: PID ([\d, ]+), left by", again["error"])
        assert named and sorted(map(int, named[1].split(", "))) == stuck, again
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
    assert "left by an earlier run" in again["error"], again
    assert len(left_in_driver(fleet)) == 1
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
    """A node that counts no CUDA process reads its GPUs alone first (the --query-gpu pdsh
    users type) and asks for their processes only where one is in use all the same (here
    one started just after the count was read): the GPUs answer and that second call does
    not. It was read dirty, its holders guessed from device files."""
    fleet = sim_fleet_factory(1)
    args = ["status", "-i", str(fleet.inventory_path), "--json", "-e", "smi_timeout=2",
            "--timeout", "20"]
    assert cli(*args).json()["hosts"][0]["status"] == "clean"
    fleet.spawn("node01", "sglang", gpus="0-1")
    fleet.set_fault("node01", "hang", "apps")
    try:
        with uvm_counted(fleet, "node01", 0):
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
    stuck = left_in_driver(fleet)
    status = cli("status", "-i", fleet.inventory_path, "--gpus", "1", "--json",
                 "-e", "smi_timeout=1", "--timeout", "20").json()["hosts"]
    assert status[0]["status"] == "faulty" and "left by an earlier run" in status[0]["error"]
    assert status[1]["status"] == "clean", status
    assert left_in_driver(fleet) == stuck


def test_a_scoped_run_whose_nvidia_smi_was_only_slow_is_an_error_not_clean(
        sim_fleet_factory, cli: Cli) -> None:  # type: ignore[no-untyped-def]
    """An nvidia-smi that SIGKILL ends was slow, not wedged (an overloaded node): the run
    could not tell the GPUs apart, so it judged nothing and signalled nobody."""
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang", gpus="0-1")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "0", "--json",
              "-e", "smi_timeout=0.001", "--timeout", "20")
    host = res.json()["hosts"][0]
    assert host["status"] == "error" and res.code == 2, host
    assert "nvidia-smi did not answer in 0.001s (smi_timeout)" in host["error"], host
    # (It is named "killed" where it had started by then: under load, it may not have.)
    assert "or the node overloaded" in host["error"] and host["signalled"] == [], host
    assert set(server) <= {p.pid for p in fleet.processes("node01")}


def test_an_exported_bundle_scoped_to_gpus_on_a_hung_driver_says_so(
        wedged: SimFleet, cli: Cli) -> None:
    """An exported bundle (clush, pdsh, an epilog) judges the host itself: its verdict and
    exit status (1: dirty or faulty) say the driver is hung, as the controller does."""
    fleet = wedged
    bundle = cli("export", "script", "post-extraction", "-i", fleet.inventory_path,
                 "-l", "node01", "--gpus", "0", "-e", "smi_timeout=1", "-e", "grace=1")
    assert bundle.code == 0, bundle.err
    out = subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), "node01", "bash -p -s"],
                         input=bundle.out, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 1, (out.returncode, out.stderr[-800:])
    verdict = out.stderr.strip().splitlines()[-1]
    assert "faulty: nvidia-smi did not answer in 1s (smi_timeout)" in verdict, verdict
    assert "(state D)" in verdict, verdict
