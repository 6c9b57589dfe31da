"""A node where no process has /dev/nvidia-uvm open (no CUDA process: the kernel's count in
/sys/module/nvidia_uvm/refcnt is 0) reads its GPUs with the query pdsh users type
(``--query-gpu``), and asks for the compute apps only where a GPU is in use all the same; one
where some do reads -q, GPUs and processes in one call (``render.early_reads``, ``verify.sh``:
fc_verify_read_gpus); a host whose last status named processes reads them while its -q read
runs (``results/lastclean.py``). Whatever the read, the table is the same: these tests read
each node both ways, as it is, and compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, spawn_cli, stop_cli, uvm_counted, wait_for

from fleetclean.engine.render import LAST_CLEAN_NOTE, NAMED_NOTE, UVM_REFCNT
from fleetclean.results import lastclean
from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim

GPU_QUERY = "--query-gpu=index,uuid,name,memory.used,memory.total --format=csv,noheader,nounits"
APPS_QUERY = ("--query-compute-apps=pid,process_name,used_memory,gpu_uuid "
              "--format=csv,noheader,nounits")
CSV_QUERY = ("--query-gpu=index,uuid,name,memory.used,memory.total,retired_pages.pending,"
             "remapped_rows.pending --format=csv,noheader,nounits")
Q_READ = "-q -d MEMORY,PIDS"
PENDING_QUERY = ("--query-gpu=index,retired_pages.pending,remapped_rows.pending "
                 "--format=csv,noheader,nounits")
# The node's status script, its nvidia-smi calls logged (their arguments, one a line).
LOGGED_STATUS = r"""nvidia-smi() { echo "$*" >>/tmp/smi.args; command nvidia-smi "$@"; }
export -f nvidia-smi
: >/tmp/smi.args
bash -s </tmp/status.sh >/tmp/status.out
cat /tmp/smi.args"""


def hinted() -> dict[str, Any]:
    return dict(json.loads(lastclean.path().read_text())["hosts"])


def both_reads(fleet: SimFleet, cli: Cli, host: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``host``'s status read with ``--query-gpu`` first (the node's count of /dev/nvidia-uvm's
    open files made 0: as if no CUDA process ran), then with -q (made 1), no processes
    named for it either time; the count put back after each, the hints as the second left
    them."""
    reads = []
    for count, first in ((0, GPU_QUERY), (1, Q_READ)):
        named_file().parent.mkdir(parents=True, exist_ok=True)
        named_file().write_text(json.dumps({"hosts": {}}))
        with uvm_counted(fleet, host, count):
            assert calls(fleet, cli, host)[0] == first
            reads.append(cli("status", "-i", fleet.inventory_path, "--json").host(host))
    return reads[0], reads[1]


def calls(fleet: SimFleet, cli: Cli, host: str) -> list[str]:
    """The nvidia-smi calls of ``host``'s status script as ``show`` renders it now."""
    script = cli("show", "status", "-i", fleet.inventory_path, "--host", host).out
    fleet.node_path(host, "/tmp/status.sh").write_text(script)
    out = fleet.run_in(host, ["bash", "-c", LOGGED_STATUS]).stdout
    return [line for line in out.splitlines() if line]


def table(host: dict[str, Any]) -> tuple[Any, ...]:
    """What a person reads of a host: its status, its error, every GPU row with its
    processes, the Xids."""
    return (host["status"], host.get("error"), json.dumps(host["gpus"], sort_keys=True),
            json.dumps(host.get("xids"), sort_keys=True))


def test_a_node_with_no_cuda_process_reads_as_pdsh_does_and_one_with_some_reads_q(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(3)
    fleet.spawn("node02", "sglang", gpus="0-7", mib=4096)
    # The node's count of CUDA processes picks the read, seen or not.
    assert fleet.node_path("node01", UVM_REFCNT).read_text() == "0\n"
    assert calls(fleet, cli, "node01") == [GPU_QUERY]
    assert calls(fleet, cli, "node02") == [Q_READ]
    first = cli("status", "-i", fleet.inventory_path, "--json")
    assert [first.host(h)["status"] for h in ("node01", "node02", "node03")] == [
        "clean", "dirty", "clean"]
    assert sorted(hinted()) == ["node01", "node03"]
    shown = cli("show", "status", "-i", fleet.inventory_path, "--host", "node01").out
    assert LAST_CLEAN_NOTE in shown and "{FC_VGFD}< <(" in shown and "{FC_VQFD}< <(" in shown
    # In use again: one -q call, not the query and then the apps after it, and each worker
    # named as the query's way names it.
    worker = fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
    assert fleet.node_path("node01", UVM_REFCNT).read_text() == "8\n"
    assert calls(fleet, cli, "node01") == [Q_READ]
    by_query, by_q = both_reads(fleet, cli, "node01")
    assert by_q["status"] == "dirty"
    named = {p["pid"] for g in by_q["gpus"] for p in g["processes"]}
    assert len(named) == 8 and named < set(worker)
    assert table(by_query) == table(by_q)
    # Seen in use: no longer noted clean; its workers named, read while -q runs.
    assert sorted(hinted()) == ["node03"]
    assert calls(fleet, cli, "node01") == [Q_READ]
    # Gone: the count is 0 again as soon as they are, and the query is back.
    fleet.run_in("node01", ["kill", "-9", *map(str, worker)])
    wait_for("the count down to 0",
             lambda: fleet.node_path("node01", UVM_REFCNT).read_text() == "0\n")
    named_file().write_text(json.dumps({"hosts": {}}))
    assert calls(fleet, cli, "node01") == [GPU_QUERY]


def test_a_cuda_process_that_holds_no_memory_makes_the_read_q_and_the_host_clean(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    cli("status", "-i", fleet.inventory_path, "--json")
    assert list(hinted()) == ["node01"]  # seen clean: its hint alone would make it the query
    fleet.spawn("node01", "holder", gpus="2", mib=0)
    assert fleet.node_path("node01", UVM_REFCNT).read_text() == "1\n"
    assert calls(fleet, cli, "node01") == [Q_READ]
    by_query, by_q = both_reads(fleet, cli, "node01")
    assert by_q["status"] == "clean" and table(by_query) == table(by_q)


def test_a_node_whose_count_cannot_be_read_reads_as_its_hint_says(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    """A sandboxed H100 showed no /sys/module/nvidia* while its CUDA server ran: there the
    query and then the apps took 3.0x the bare query's wall, -q 1.9x. Without the count,
    a host never seen reads -q, one seen clean the query, as the controller's hint says."""
    fleet = sim_fleet_factory(2)
    cli("status", "-i", fleet.inventory_path, "--json")
    fleet.spawn("node02", "sglang", gpus="0-7", mib=1024)
    lastclean.path().write_text(json.dumps({"hosts": {"node01": 1e12}}))
    with uvm_counted(fleet, "node01", None), uvm_counted(fleet, "node02", None):
        assert not fleet.node_path("node02", UVM_REFCNT).exists()
        assert calls(fleet, cli, "node01") == [GPU_QUERY]
        assert calls(fleet, cli, "node02") == [Q_READ]
        host = cli("status", "-i", fleet.inventory_path, "--json").host("node02")
    assert host["status"] == "dirty" and len(host["gpus"][0]["processes"]) == 1
    assert fleet.node_path("node02", UVM_REFCNT).read_text() == "8\n"
    # Where the driver's module shows and nvidia_uvm's does not, no CUDA process has run
    # since boot: a count of 0, the query, on a host never seen too.
    lastclean.path().write_text(json.dumps({"hosts": {}}))
    with uvm_counted(fleet, "node01", None):
        fleet.node_path("node01", UVM_REFCNT).parent.rmdir()
        try:
            assert calls(fleet, cli, "node01") == [GPU_QUERY]
        finally:
            fleet.node_path("node01", UVM_REFCNT).parent.mkdir()
    assert fleet.node_path("node01", UVM_REFCNT).read_text() == "0\n"


def test_memory_no_process_holds_is_found_by_the_query_as_with_q(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    fleet.set_fault("node01", "leak", 3, 1500)
    # The apps explain nothing: the holders of /dev/nvidia3 are looked for, its device
    # minor read from the driver's file of the uuid the query gave.
    assert calls(fleet, cli, "node01") == [GPU_QUERY, APPS_QUERY]
    out = fleet.node_path("node01", "/tmp/status.out").read_text()
    assert "@@fleetclean\tbare\t3\t1500" in out
    by_query, by_q = both_reads(fleet, cli, "node01")
    assert by_q["status"] == "dirty" and table(by_query) == table(by_q)


def test_a_pending_remap_is_read_beside_the_query(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    cli("status", "-i", fleet.inventory_path, "--json")
    fleet.set_fault("node01", "xid", 13, 2)  # an application's Xid: no remap can be pending
    assert calls(fleet, cli, "node01") == [GPU_QUERY]
    fleet.set_fault("node01", "none")
    cli("status", "-i", fleet.inventory_path, "--json")
    # The ECC error that marks a row (Xid 63): the pending fields are asked for beside.
    fleet.set_fault("node01", "remapped-pending", 1)
    assert sorted(calls(fleet, cli, "node01")) == sorted([GPU_QUERY, PENDING_QUERY])
    by_query, by_q = both_reads(fleet, cli, "node01")
    assert by_q["status"] == "faulty"
    assert "GPU1: remapped rows pending" in by_q["error"]
    assert table(by_query) == table(by_q)


@pytest.mark.parametrize("fault", [("lost", 2), ("inforom",), ("nvml",), ("na",)])
def test_a_failing_query_reads_as_a_failing_q_read_does(
    sim_fleet_factory: Any, cli: Cli, fault: tuple[Any, ...]
) -> None:
    fleet = sim_fleet_factory(1)
    cli("status", "-i", fleet.inventory_path, "--json")
    assert list(hinted()) == ["node01"]
    fleet.set_fault("node01", *fault)
    # The query's answer is not taken: the CSV queries ask anew, as after a failed -q.
    made = calls(fleet, cli, "node01")
    assert made[0] == GPU_QUERY and "-q -d MEMORY,PIDS" not in made
    assert sorted(made[1:3]) == sorted([APPS_QUERY, CSV_QUERY])
    by_query, by_q = both_reads(fleet, cli, "node01")
    assert by_q["status"] != "clean" and table(by_query) == table(by_q)


def wrap_smi(fleet: SimFleet, host: str, first: str) -> None:
    """The node's own nvidia-smi replaced by one that runs the shell line ``first`` first
    (its link to the fleet's shared copy removed, that copy kept as /tmp/real-smi)."""
    script = ("cp /usr/local/sbin/nvidia-smi /tmp/real-smi\n"
              "rm /usr/local/sbin/nvidia-smi\n"
              f"printf '#!/bin/sh\\n%s\\nexec /tmp/real-smi \"$@\"\\n' '{first}'"
              " >/usr/local/sbin/nvidia-smi\n"
              "chmod 755 /usr/local/sbin/nvidia-smi")
    assert fleet.run_in(host, ["bash", "-c", script]).returncode == 0


def test_a_watch_reads_each_host_by_what_its_node_counts(
    sim_fleet_factory: Any, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    wrap_smi(fleet, "node01", 'echo "$*" >>/tmp/smi.log')
    log = fleet.node_path("node01", "/tmp/smi.log")
    log.write_text("")

    def seen() -> list[str]:
        return log.read_text().splitlines()

    proc = spawn_cli(tmp_path, "status", "--watch", "0.2", "-i", str(fleet.inventory_path))
    try:
        # No CUDA process: the query, refresh after refresh.
        wait_for("two refreshes", lambda: len(seen()) >= 2)
        assert seen()[:2] == [GPU_QUERY, GPU_QUERY]
        fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
        # In use: -q from the first refresh that read the count after the spawn (one
        # under way may have read it before: the query, then the apps).
        wait_for("a -q read", lambda: Q_READ in seen())
        after = len(seen())
        wait_for("two refreshes more", lambda: len(seen()) >= after + 2)
        assert seen()[after:after + 2] == [Q_READ, Q_READ]
    finally:
        _, err = stop_cli(proc)
    assert proc.returncode == 130, err


# The node's status script run with its nvidia-smi slowed (a second before each call) and
# its trace kept (on a descriptor of its own: the early read sends its stderr into its
# pipe, where the trace would be taken for the read's answer): what it did before the -q
# read answered.
TRACED_STATUS = r"""nvidia-smi() { sleep 1; command nvidia-smi "$@"; }
export -f nvidia-smi
BASH_XTRACEFD=5 bash -x -s </tmp/status.sh >/tmp/status.out 5>/tmp/status.trace
grep -E '^\++ (fc_verify_proc_read|fc_verify_early_q) ' /tmp/status.trace"""


def named_file() -> Path:
    return lastclean.path().with_name(lastclean.NAMED_FILE)


def started(fleet: SimFleet, host: str, pids: list[int]) -> list[list[int]]:
    """[PID, start time] of each of ``pids`` in ``host``, as last-named.json keeps them."""
    out = fleet.run_in(host, ["cat", *(f"/proc/{pid}/stat" for pid in pids)]).stdout
    return [[pid, int(line.rsplit(")", 1)[1].split()[19])]
            for pid, line in zip(pids, out.splitlines(), strict=True)]


def words(named: list[list[int]]) -> str:
    return " ".join(f"{pid}:{start}" for pid, start in named)


def test_a_host_seen_in_use_reads_what_it_named_while_its_gpu_read_runs(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(2)
    worker = fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
    fleet.spawn("node02", "monitor")
    first = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    pids = sorted({p["pid"] for g in first["gpus"] for p in g["processes"]})
    assert len(pids) == 8 and set(pids) < set(worker)
    hint = words(started(fleet, "node01", pids))
    assert lastclean.named() == {"node01": hint}
    # Its next status reads each of them while its -q read runs (here slowed to a second),
    # not after.
    script = cli("show", "status", "-i", fleet.inventory_path, "--host", "node01").out
    assert f"FC_VHINT='{hint}'" in script and NAMED_NOTE in script
    fleet.node_path("node01", "/tmp/status.sh").write_text(script)
    trace = fleet.run_in("node01", ["bash", "-c", TRACED_STATUS]).stdout.splitlines()
    early = [i for i, line in enumerate(trace) if "fc_verify_early_q" in line]
    read = [line.split()[2] for line in trace[:early[0]] if "fc_verify_proc_read" in line]
    assert read == list(map(str, pids))
    assert not any("fc_verify_proc_read" in line for line in trace[early[0]:])
    # The table is the one a host never seen gets.
    with_hint = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    named_file().write_text(json.dumps({"hosts": {}}))
    without = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert table(with_hint) == table(without) == table(first)
    assert lastclean.named() == {"node01": hint}


def test_processes_read_early_keep_each_its_own_owner(sim_fleet_factory: Any, cli: Cli) -> None:
    fleet = sim_fleet_factory(1)
    for kind, gpu in (("tmux", 0), ("service", 1), ("screen", 2)):
        fleet.spawn("node01", kind, gpu=gpu, mib=2048)
    # nvidia-smi a second slower: the early read of the processes named is sure to be
    # done before it answers.
    wrap_smi(fleet, "node01", "sleep 1")
    first = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    owners = {g["index"]: p["owner"]["kind"] for g in first["gpus"] for p in g["processes"]}
    assert owners == {0: "tmux", 1: "systemd", 2: "screen"}
    assert lastclean.named()
    with_hint = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert table(with_hint) == table(first)


def test_a_stale_hint_of_processes_named_changes_nothing_in_the_table(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    worker = fleet.spawn("node01", "sglang", gpus="0-3", mib=2048)
    monitor = fleet.spawn("node01", "monitor")
    without = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    # Named last time: a process that holds no GPU now, one long gone, one worker, and a
    # process since gone whose PID a worker has now (another start time).
    live = started(fleet, "node01", [monitor[0], worker[-1], worker[0]])
    stale = [live[0], [4_000_000, 1], live[1], [worker[0], live[2][1] + 5]]
    named_file().write_text(json.dumps({"hosts": {"node01": [1e9, stale]}}))
    assert lastclean.named() == {"node01": words(stale)}
    with_hint = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert with_hint["status"] == "dirty" and table(with_hint) == table(without)
    # The next one reads the processes this one named.
    named = sorted({p["pid"] for g in with_hint["gpus"] for p in g["processes"]})
    assert lastclean.named() == {"node01": words(started(fleet, "node01", named))}
    assert monitor[0] not in named
    # A host clean again is forgotten.
    fleet.run_in("node01", ["kill", "-9", *map(str, worker)])
    wait_for("the GPUs free", lambda: cli("status", "-i", fleet.inventory_path,
                                          "--json").host("node01")["status"] == "clean")
    assert lastclean.named() == {}
