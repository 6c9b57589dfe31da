"""A host whose GPUs all read clean at its last status reads them next time with the
query pdsh users type (``--query-gpu``), and asks for the compute apps only where a GPU is in
use again (``results/lastclean.py``, ``verify.sh``: fc_verify_read_gpus). Whatever the read,
the table is the same: these tests read each node both ways, as it is, and compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, spawn_cli, stop_cli, wait_for

from fleetclean.engine.render import LAST_CLEAN_NOTE, NAMED_NOTE
from fleetclean.results import lastclean
from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim

GPU_QUERY = "--query-gpu=index,uuid,name,memory.used,memory.total --format=csv,noheader,nounits"
APPS_QUERY = ("--query-compute-apps=pid,process_name,used_memory,gpu_uuid "
              "--format=csv,noheader,nounits")
CSV_QUERY = ("--query-gpu=index,uuid,name,memory.used,memory.total,retired_pages.pending,"
             "remapped_rows.pending --format=csv,noheader,nounits")
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
    """``host``'s status as the hint makes it read, then as a host never seen clean reads
    it (-q); the hint left as the first of the two left it."""
    with_hint = cli("status", "-i", fleet.inventory_path, "--json").host(host)
    after = lastclean.path().read_text()
    lastclean.path().write_text(json.dumps({"hosts": {}}))
    without = cli("status", "-i", fleet.inventory_path, "--json").host(host)
    lastclean.path().write_text(after)
    return with_hint, without


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


def test_a_host_seen_clean_reads_as_pdsh_does_and_names_who_uses_it_again(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(3)
    fleet.spawn("node02", "sglang", gpus="0-7", mib=4096)
    # Never seen: every host reads -q; the clean ones are noted.
    assert calls(fleet, cli, "node01") == ["-q -d MEMORY,PIDS"]
    first = cli("status", "-i", fleet.inventory_path, "--json")
    assert [first.host(h)["status"] for h in ("node01", "node02", "node03")] == [
        "clean", "dirty", "clean"]
    assert sorted(hinted()) == ["node01", "node03"]
    # node01 now reads the GPUs as pdsh would, one call; node02 (in use) still reads -q.
    shown = cli("show", "status", "-i", fleet.inventory_path, "--host", "node01").out
    assert LAST_CLEAN_NOTE in shown and "{FC_VGFD}< <(" in shown
    assert calls(fleet, cli, "node01") == [GPU_QUERY]
    assert calls(fleet, cli, "node02") == ["-q -d MEMORY,PIDS"]
    # In use again: the compute apps are asked for after the GPUs, and each worker is
    # named as the -q read names it.
    worker = fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
    assert calls(fleet, cli, "node01") == [GPU_QUERY, APPS_QUERY]
    with_hint, without = both_reads(fleet, cli, "node01")
    assert with_hint["status"] == "dirty"
    named = {p["pid"] for g in with_hint["gpus"] for p in g["processes"]}
    assert len(named) == 8 and named < set(worker)
    assert table(with_hint) == table(without)
    # Seen in use: the hint is gone, and the next status reads -q again.
    assert sorted(hinted()) == ["node03"]
    assert calls(fleet, cli, "node01") == ["-q -d MEMORY,PIDS"]


def test_memory_no_process_holds_on_a_host_seen_clean_is_found_as_with_q(
    sim_fleet_factory: Any, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    cli("status", "-i", fleet.inventory_path, "--json")
    assert list(hinted()) == ["node01"]
    fleet.set_fault("node01", "leak", 3, 1500)
    # The apps explain nothing: the holders of /dev/nvidia3 are looked for, its device
    # minor read from the driver's file of the uuid the query gave.
    assert calls(fleet, cli, "node01") == [GPU_QUERY, APPS_QUERY]
    out = fleet.node_path("node01", "/tmp/status.out").read_text()
    assert "@@fleetclean\tbare\t3\t1500" in out
    with_hint, without = both_reads(fleet, cli, "node01")
    assert with_hint["status"] == "dirty" and table(with_hint) == table(without)


def test_a_pending_remap_on_a_host_seen_clean_is_read_beside_the_query(
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
    with_hint, without = both_reads(fleet, cli, "node01")
    assert with_hint["status"] == "faulty"
    assert "GPU1: remapped rows pending" in with_hint["error"]
    assert table(with_hint) == table(without)


@pytest.mark.parametrize("fault", [("lost", 2), ("inforom",), ("nvml",), ("na",)])
def test_a_failing_query_on_a_host_seen_clean_reads_as_before(
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
    with_hint, without = both_reads(fleet, cli, "node01")
    assert with_hint["status"] != "clean" and table(with_hint) == table(without)


def wrap_smi(fleet: SimFleet, host: str, first: str) -> None:
    """The node's own nvidia-smi replaced by one that runs the shell line ``first`` first
    (its link to the fleet's shared copy removed, that copy kept as /tmp/real-smi)."""
    script = ("cp /usr/local/sbin/nvidia-smi /tmp/real-smi\n"
              "rm /usr/local/sbin/nvidia-smi\n"
              f"printf '#!/bin/sh\\n%s\\nexec /tmp/real-smi \"$@\"\\n' '{first}'"
              " >/usr/local/sbin/nvidia-smi\n"
              "chmod 755 /usr/local/sbin/nvidia-smi")
    assert fleet.run_in(host, ["bash", "-c", script]).returncode == 0


def test_a_watch_reads_each_host_by_what_its_last_refresh_saw(
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
        # Never seen: -q; seen clean: the query from the next refresh on.
        wait_for("two refreshes", lambda: len(seen()) >= 2)
        assert seen()[:2] == ["-q -d MEMORY,PIDS", GPU_QUERY]
        fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
        # In use again: the apps after the query, then -q while it stays in use.
        wait_for("the worker seen", lambda: APPS_QUERY in seen())
        wait_for("a -q read after it",
                 lambda: "-q -d MEMORY,PIDS" in seen()[seen().index(APPS_QUERY):])
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
