"""Fleet runs: many simulated hosts at once, mixed outcomes, host keys, run records."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from simhelp import Cli, alive, edit_inventory, spawn_cli, ssh_log_count

pytestmark = pytest.mark.sim


@pytest.mark.slow
def test_32_nodes_with_mixed_workloads_all_clean_and_report_matches_nvidia_smi(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(32)
    kinds = ["sglang", "orphan", "stubborn", "slow", "monitor", "persistenced"]
    for i, kind in enumerate(kinds):
        fleet.spawn_all(fleet.nodes[i::len(kinds)], kind)
    fleet.spawn_all(fleet.nodes[::2], "sglang", gpus="4-7")

    before = cli("status", "-i", fleet.inventory_path, "--json")
    used = fleet.gpu_used_all(fleet.nodes)
    assert any(sum(mib) for mib in used.values())
    for host in before.json()["hosts"]:
        assert [g["memory_used_mib"] for g in host["gpus"]] == used[host["host"]], host

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=2", "--json")

    assert res.code == 0, res.out
    data = res.json()
    assert data["summary"] == {"hosts": 32, "clean": 32, "dirty": 0, "faulty": 0,
                               "failed": 0}
    used = fleet.gpu_used_all(fleet.nodes)
    for host in data["hosts"]:
        assert [g["memory_used_mib"] for g in host["gpus"]] == used[host["host"]] == [0] * 8

    table = cli("status", "-i", fleet.inventory_path)
    assert table.code == 0
    assert "node[01-32]" in table.out
    assert "32 hosts: 32 clean, 0 dirty, 0 failed" in table.out


def test_mixed_outcomes_in_one_run(sim_fleet_factory, cli: Cli, tmp_path: Path) -> None:
    fleet = sim_fleet_factory(6)
    for node in fleet.nodes:
        fleet.spawn(node.name, "sglang", gpus="0-1")
    fleet.spawn("node04", "respawn", gpu=2)
    fleet.stop_node("node01")
    fleet.rotate_host_key("node03")
    marker_pids = fleet.spawn("node03", "monitor")
    wrong_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)],
                   check=True)
    inventory = edit_inventory(fleet, tmp_path / "inv.yaml",
                               node02={"ansible_ssh_private_key_file": str(wrong_key)})
    node03_before = {p.pid for p in fleet.processes("node03")}

    res = cli("run", "post-extraction", "-i", inventory, "-e", "grace=1",
              "-e", "verify_timeout=2", "--json")

    assert res.code == 2
    status = {h["host"]: h["status"] for h in res.json()["hosts"]}
    assert status == {
        "node01": "unreachable",
        "node02": "auth_failed",
        "node03": "host_key_mismatch",
        "node04": "dirty",
        "node05": "clean",
        "node06": "clean",
    }
    assert "train_worker" in res.host("node04")["error"]
    assert "CHANGED" in res.host("node03")["error"]
    # nothing ran on the host whose key changed
    assert {p.pid for p in fleet.processes("node03")} == node03_before
    assert set(marker_pids) <= node03_before
    assert fleet.gpu_used_mib("node03")[0] > 0


def test_a_fleet_serving_the_same_model_is_one_problem_line(
    sim_fleet_factory, cli: Cli
) -> None:
    # As on real nodes, each node's server has PIDs of its own: a line a host would be 100
    # lines for 100 busy hosts of a 1,000-node fleet (issue #18). The PIDs stay in --json.
    fleet = sim_fleet_factory(3)
    pids = fleet.spawn_all(["node01", "node02"], "sglang", gpus="0-1", mib=4096)
    assert pids["node01"] != pids["node02"]

    table = cli("status", "-i", fleet.inventory_path)
    assert table.code == 1, table.out
    said = [line for line in table.out.splitlines() if ": dirty: " in line]
    assert said == ["node[01-02]: dirty: GPU0 4096 MiB, GPU1 4096 MiB; held by <pid> "
                    "sglang::scheduler_TP0 (root; GPU0), <pid> sglang::scheduler_TP1 (root; "
                    "GPU1) (each host's PIDs: --json)"]

    named = cli("status", "-i", fleet.inventory_path, "--json")
    for node in ("node01", "node02"):
        held = re.findall(r"(\d+) sglang::scheduler_TP", named.host(node)["error"])
        assert len(held) == 2 and {int(pid) for pid in held} <= set(pids[node])


def with_empty_known_hosts(fleet, tmp_path: Path, more: str = "") -> tuple[Path, Path]:
    """The fleet's inventory with an empty known_hosts file of its own (and ``more`` ssh
    arguments): (inventory, known_hosts)."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    inventory = tmp_path / "inv.yaml"
    data = yaml.safe_load(fleet.inventory_path.read_text())
    data["all"]["vars"]["ansible_ssh_common_args"] = f"-o UserKnownHostsFile={known} {more}"
    inventory.write_text(yaml.safe_dump(data))
    return inventory, known


def test_unknown_host_key_refused_then_accepted_and_recorded(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    inventory, known = with_empty_known_hosts(fleet, tmp_path)

    refused = cli("status", "-i", inventory, "--json")
    assert refused.code == 2
    for host in refused.json()["hosts"]:
        assert host["status"] == "host_key_mismatch"
        assert "unknown host key" in host["error"] and "SHA256:" in host["error"]
        assert "--accept-new-host-keys" in host["error"]
    assert known.read_text() == ""
    # As a person reads it: one line for both hosts, each one's address and key folded.
    table = cli("status", "-i", inventory)
    said = [line for line in table.out.splitlines() if ": host_key_mismatch: " in line]
    assert said == ["node[01-02]: host_key_mismatch: unknown host key for <address> "
                    "(ssh-ed25519 <fingerprint>); check it, then rerun with "
                    "--accept-new-host-keys or add it to known_hosts (each host's key: --json)"]

    accepted = cli("status", "-i", inventory, "--accept-new-host-keys", "--json")
    assert accepted.code == 0, accepted.out
    lines = known.read_text().splitlines()
    assert {line.split()[0] for line in lines} == {n.address for n in fleet.nodes}

    again = cli("status", "-i", inventory, "--json")
    assert again.code == 0


def test_hash_known_hosts_writes_accepted_keys_hashed_and_reads_them_back(
    sim_fleet_factory, cli: Cli, tmp_path: Path
) -> None:
    # HashKnownHosts yes (Debian's and Ubuntu's /etc/ssh/ssh_config): ssh writes a new
    # host hashed; fleetclean wrote every node's address in the clear.
    fleet = sim_fleet_factory(2)
    inventory, known = with_empty_known_hosts(fleet, tmp_path, "-o HashKnownHosts=yes")
    accepted = cli("status", "-i", inventory, "--accept-new-host-keys", "--json")
    assert accepted.code == 0, accepted.out
    lines = known.read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("|1|") for line in lines)
    assert not any(n.address in known.read_text() for n in fleet.nodes)
    again = cli("status", "-i", inventory, "--json")  # the hashed names match
    assert again.code == 0, again.out


def started(fleet, before: int, proc: subprocess.Popen[str], logins: int = 0) -> None:
    """Until every node's sshd (or ``logins`` of them) has let the run in: its hosts are
    then in flight, in their first stage's grace (3 s and 120 s long)."""
    deadline = time.monotonic() + 60
    while ssh_log_count(fleet, "Accepted publickey") < before + (logins or len(fleet.nodes)):
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)


def test_interrupted_run_writes_a_record_and_exits_130(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    for node in fleet.nodes:
        fleet.spawn(node.name, "stubborn", gpu=1)
    before = ssh_log_count(fleet, "Accepted publickey")
    proc = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(fleet.inventory_path),
                     "-e", "grace=3", "--json")
    # Ctrl-C once both hosts run their script (on a loaded machine, a fixed sleep could
    # land in the interpreter's start-up, where Python itself dies of SIGINT).
    started(fleet, before, proc)
    proc.send_signal(signal.SIGINT)  # our own child, by PID
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    records = list((tmp_path / "state" / "runs").glob("*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["interrupted"] is True
    assert record["playbook"] == "post-extraction"
    assert json.loads(out)["summary"]["hosts"] == 2


# A transport that takes long to load (a machine at load 25 took seconds to import it):
# the import of fleetclean.transport.session says it began, then waits (or a Ctrl-C).
SLOW_TRANSPORT = """\
import sys, time
from pathlib import Path

class SlowTransport:
    def find_spec(self, name, path=None, target=None):
        if name == "fleetclean.transport.session":
            Path({marker!r}).write_text("loading")
            time.sleep(30)
        return None

sys.meta_path.insert(0, SlowTransport())
"""


def test_a_ctrl_c_while_the_transport_loads_records_the_run_and_reaches_no_host(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    holders = {n.name: fleet.spawn(n.name, "stubborn", gpu=1) for n in fleet.nodes}
    hook, marker = tmp_path / "hook", tmp_path / "loading"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_TRANSPORT.format(marker=str(marker)))
    before = ssh_log_count(fleet, "Connection from")
    env = dict(os.environ, FLEETCLEAN_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-m", "fleetclean", "run", "post-extraction",
                             "-i", str(fleet.inventory_path), "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # our own child, by PID
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["summary"]["hosts"] == 2
    assert {h["status"] for h in result["hosts"]} == {"error"}
    assert all("not started" in h["error"] for h in result["hosts"])
    (record,) = (tmp_path / "state" / "runs").glob("*.json")
    assert json.loads(record.read_text())["interrupted"] is True
    # Nothing reached any host: no connection, every holder still runs.
    assert ssh_log_count(fleet, "Connection from") == before
    for node, pids in holders.items():
        assert alive(fleet, node, pids) == pids


def test_history_lists_and_shows_runs(sim_fleet_factory, cli: Cli) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang", gpus="0")
    assert cli("run", "pre-restart", "-i", fleet.inventory_path, "--json").code == 0
    listing = cli("history")
    assert "pre-restart" in listing.out and "1 host 1 clean" in listing.out
    shown = cli("history", "-1")
    assert f"node01: SIGTERM {server[0]} python3 -m sglang.launch_server" in shown.out


def test_a_second_ctrl_c_stops_waiting_for_running_hosts(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    (stubborn,) = fleet.spawn("node01", "stubborn", gpu=1)
    before = ssh_log_count(fleet, "Accepted publickey")
    # One host at a time: node02 waits its turn, which never comes.
    proc = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(fleet.inventory_path),
                     "-e", "grace=120", "--timeout", "200", "--forks", "1", "--json")
    try:
        started(fleet, before, proc, logins=1)
        time.sleep(0.5)  # into the holder's grace
        proc.send_signal(signal.SIGINT)  # our own child, by PID
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)  # not the 120 s grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    # What the host did before the run stopped waiting is reported and recorded: it sent
    # the stubborn holder SIGTERM (its grace was running). Never "not started"; the host
    # whose turn never came is.
    one, two = json.loads(out)["hosts"]
    assert one["status"] == "error" and "not started" not in one["error"], one
    assert [(s["pid"], s["signal"]) for s in one["signalled"]] == [(stubborn, "TERM")]
    assert two["error"].startswith("not started"), two
    (record,) = (tmp_path / "state" / "runs").glob("*.json")
    kept = json.loads(record.read_text())
    assert kept["interrupted"] is True
    assert kept["changes"]["node01"]["signalled"][0]["pid"] == stubborn
