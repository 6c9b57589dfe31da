"""Scope filters for nodes that several people use, on the simulated fleet with processes
of two users, root's and nobody's (started with setpriv inside the node): ``--user`` signals
only that user's processes; ``--gpus`` kills only the holders of those GPUs and judges only
them (the others are shown). The node's GPU minors differ from nvidia-smi's order, so a GPU
is never taken for the /dev/nvidiaN of the same number."""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from simhelp import Cli, alive, spawn_holder

from fleetclean.results import records
from fleetclean.sim import SimFleet, uvm_count

pytestmark = pytest.mark.sim
# A run that must end dirty waits out its verification: kept short. One that must end clean
# ends as soon as the GPUs are free, so it gets time to spare on a loaded machine.
FAST = ("-e", "grace=1", "-e", "verify_timeout=1")
SETTLE = ("-e", "grace=1", "-e", "verify_timeout=20")


def spawn_as(fleet: SimFleet, node: str, user: str, *, gpu: int, mib: int, name: str) -> int:
    """A holder of GPU ``gpu`` run by system account ``user`` (root, nobody: the nodes copy
    this machine's) and called ``name``, once it holds the GPU."""
    account = pwd.getpwnam(user)
    return spawn_holder(fleet, node, account.pw_uid, account.pw_gid, gpu=gpu, mib=mib, name=name)


def test_user_signals_only_that_users_processes(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    # Both match the worker pattern (sglang) and hold a GPU: only the owner tells them apart.
    theirs = spawn_as(fleet, "node01", "nobody", gpu=2, mib=2048, name="sglang-worker-of-nobody")
    roots = spawn_as(fleet, "node01", "root", gpu=5, mib=4096, name="sglang-worker-of-root")

    check = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "nobody",
                "--check")
    assert "scope: only user nobody's processes" in check.out
    assert "sglang-worker-of-nobody" in check.out
    assert "sglang-worker-of-root" not in check.out
    assert alive(fleet, "node01", [theirs, roots]) == [theirs, roots]

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "nobody", *FAST,
              "--json")
    assert alive(fleet, "node01", [theirs, roots]) == [roots]
    host = res.host("node01")
    assert [s["pid"] for s in host["signalled"]] == [theirs]
    # root's GPU is still in use: the verification still judges every GPU.
    assert host["status"] == "dirty"
    assert fleet.gpu_used_mib("node01") == [0, 0, 0, 0, 0, 4096, 0, 0]
    assert records.load_record("-1")["scope"] == {"user": "nobody", "gpus": None,
                                                  "slurm_job": False}

    # A UID works as well as a name; a user the host does not know is refused there.
    unknown = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user",
                  "no-such-user", *FAST, "--json")
    assert unknown.code == 2
    assert "--user no-such-user: no such user on this host" in unknown.host("node01")["error"]
    assert alive(fleet, "node01", [roots]) == [roots]
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "0", *SETTLE,
              "--json")
    assert res.code == 0, res.out
    assert alive(fleet, "node01", [roots]) == []


def test_a_bad_user_is_refused_before_anything_is_sent(cli: Cli, tmp_path: Path) -> None:
    res = cli("run", "post-extraction", "-i", "gpu01,", "--user", "alice; rm -rf /")
    assert res.code == 4
    assert "--user 'alice; rm -rf /' is not a user name or a UID" in res.err


def test_gpus_limits_kills_and_verification_to_those_gpus(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    mine = spawn_as(fleet, "node01", "root", gpu=0, mib=1000, name="trainer-on-0")
    theirs = spawn_as(fleet, "node01", "nobody", gpu=3, mib=3000, name="trainer-on-3")
    # Another GPU's process whose name the playbook's worker pattern matches (sglang).
    other = spawn_as(fleet, "node01", "root", gpu=5, mib=5000, name="sglang-on-5")
    status = cli("status", "-i", fleet.inventory_path, "--gpus", "5", "--json")
    assert (status.code, status.host("node01")["gpus_judged"]) == (1, [5])
    # GPU0 and GPU3 are not judged: neither their memory nor their holders are named.
    reason = status.host("node01")["error"]
    assert reason.startswith(f"GPU5 5000 MiB; held by {other} ") and reason.endswith(
        "(root; GPU5)"), reason
    # The holders it names (a PID after "held by " or after the previous holder's "), "):
    # not a substring test, which PID 7 fails inside "held by 17".
    named = {int(pid) for pid in re.findall(r"(?:held by |\), )(\d+) ", reason)}
    assert named == {other}, reason

    check = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "0,3",
                "--check")
    assert "scope: only processes, on GPUs 0,3" in check.out
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "0,3", *SETTLE,
              "--json")
    host = res.host("node01")
    assert alive(fleet, "node01", [mine, theirs, other]) == [other]
    assert sorted(s["pid"] for s in host["signalled"]) == sorted([mine, theirs])
    # GPU5 is still busy, shown but not judged: clean.
    assert (res.code, host["status"], host["gpus_judged"]) == (0, "clean", [0, 3])
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0, 0, 0, 0, 0, 5000, 0, 0]
    assert records.load_record("-1")["scope"]["gpus"] == [0, 3]

    # With --user too: both filters hold.
    again = spawn_as(fleet, "node01", "root", gpu=3, mib=3000, name="trainer-on-3-of-root")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "3",
              "--user", "nobody", *FAST, "--json")
    assert alive(fleet, "node01", [again, other]) == [again, other]
    assert res.host("node01")["status"] == "dirty"
    assert res.host("node01")["error"].startswith("GPU3 3000 MiB")
    bad = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "9", *FAST,
              "--json")
    assert bad.code == 2
    assert "this host has no GPU 9" in bad.host("node01")["error"]



def test_a_job_that_sees_every_gpu_is_neither_blamed_for_nor_killed_by_another_gpus_leak(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    """CUDA opens the device file of every GPU it may see (no CUDA_VISIBLE_DEVICES, no
    device cgroup) and uses only its own: a job on GPU1 has /dev/nvidia5 open too. With a
    driver-level leak on GPU5, the status named the job as GPU5's holder, and a teardown of
    GPU5 alone (an epilog's scope) killed it."""
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    [job] = fleet.spawn("node01", "holder", gpus="1", mib=2048, sees="all")
    # And one whose name the playbook's worker pattern matches (sglang): a stage that
    # signals by name spares a process that holds only other GPUs, which this one, by its
    # files, did not.
    [named] = fleet.spawn("node01", "holder", gpus="3", mib=1024, sees="all",
                          name="sglang::scheduler_TP0")
    held = fleet.run_in("node01", ["ls", "-l", f"/proc/{job}/fd"]).stdout
    assert " -> /dev/nvidia2\n" in held  # GPU5's file (its minor is 2), with no memory there
    fleet.set_fault("node01", "leak", 5, 4096)
    status = cli("status", "-i", fleet.inventory_path, "--json")
    gpus = status.host("node01")["gpus"]
    assert [(p["pid"], p["protected"]) for p in gpus[1]["processes"]] == [(job, None)]
    # Shown on GPU5 as having its file open, not as who holds its memory.
    on5 = {p["pid"]: p["protected"] for p in gpus[5]["processes"]}
    assert on5.get(job) == "uses GPU1", gpus[5]
    assert "held by no process" in status.host("node01")["error"], status.host("node01")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "5", *FAST,
              "--json")
    host = res.host("node01")
    assert not {job, named} & {s["pid"] for s in host["signalled"]}, host
    assert alive(fleet, "node01", [job, named]) == [job, named]
    assert fleet.gpu_used_mib("node01")[1] == 2048


def test_a_jobs_unlisted_kin_that_hold_every_gpus_file_go_by_the_jobs_gpus(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    """A forked child inherits its parent's CUDA files (a DataLoader's workers) and has no
    context, so nvidia-smi lists it nowhere: with GPU5 leaking, the child of a job on GPU1
    was named as GPU5's holder, and killed by a teardown of GPU5 alone, by gpu-holders and,
    its name matching the worker pattern, by the scope of a stage that signals by name. An
    unlisted process now goes by the GPUs of its nearest listed ancestor or group."""
    fleet = sim_fleet_factory(1, gpu_minors=[7, 6, 5, 4, 3, 2, 1, 0])
    parent = (
        "import os, subprocess, time\n"
        "fds = [os.open(f'/dev/nvidia{m}', os.O_RDWR) for m in range(8)]\n"
        "fds.append(os.open('/dev/nvidia-uvm', os.O_RDWR))\n"
        f"{uvm_count.OPENED_PY}\n"
        "env = dict(os.environ, FLEETCLEAN_SIM_GPU_MIB='0')\n"
        "subprocess.Popen(['sglang-data-worker', '-c', 'import time; time.sleep(3600)'],"
        " executable='/usr/bin/python3', pass_fds=fds, env=env)\n"
        "time.sleep(3600)\n")
    start = ("FLEETCLEAN_SIM_GPU_MIB=2048 FLEETCLEAN_SIM_GPU_CONTEXTS=1 setsid -f python3 -c"
             ' "$1" fctrainer-on-gpu1 </dev/null >/dev/null 2>&1')
    assert fleet.run_in("node01", ["sh", "-c", start, "sh", parent]).returncode == 0
    for _ in range(300):
        procs = {p.cmdline.split()[0]: p.pid for p in fleet.processes("node01")}
        if "sglang-data-worker" in procs and fleet.gpu_used_mib("node01")[1] >= 2048:
            break
        fleet.run_in("node01", ["sleep", "0.05"])
    job = next(p.pid for p in fleet.processes("node01") if "fctrainer-on-gpu1" in p.cmdline)
    child = procs["sglang-data-worker"]
    fleet.set_fault("node01", "leak", 5, 4096)
    status = cli("status", "-i", fleet.inventory_path, "--json")
    host = status.host("node01")
    on5 = {p["pid"]: p for p in host["gpus"][5]["processes"]}
    assert child in on5 and on5[child]["protected"] == f"kin of pid {job}, which uses GPU1", on5
    assert "held by no process" in host["error"], host
    # A CUDA process of no listed kin with GPU5's file open is still named its holder (its
    # parent a shell that waits for it, as a script's: the walk reads that shell too).
    code = ("import time; f = open('/dev/nvidia2'); u = open('/dev/nvidia-uvm');"
            f" {uvm_count.OPENED_PY}; time.sleep(3600)")
    start = ("setsid -f sh -c 'FLEETCLEAN_SIM_GPU_MIB=0 python3 -c \"$1\" fcstray-on-gpu5; :'"
             ' sh "$1" </dev/null >/dev/null 2>&1')
    assert fleet.run_in("node01", ["sh", "-c", start, "sh", code]).returncode == 0
    stray, fds = 0, ""
    for _ in range(300):
        stray = next((p.pid for p in fleet.processes("node01")
                      if p.cmdline.startswith("python3 -c") and "fcstray" in p.cmdline), 0)
        fds = fleet.run_in("node01", ["ls", "-l", f"/proc/{stray}/fd"]).stdout if stray else ""
        if " -> /dev/nvidia-uvm\n" in fds:
            break
        fleet.run_in("node01", ["sleep", "0.05"])
    assert " -> /dev/nvidia2\n" in fds, fds
    host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    on5 = {p["pid"]: p for p in host["gpus"][5]["processes"]}
    assert stray in on5 and on5[stray]["protected"] is None, on5
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--gpus", "5", *FAST,
              "--json")
    host = res.host("node01")
    assert not {job, child} & {s["pid"] for s in host["signalled"]}, host
    assert alive(fleet, "node01", [job, child, stray]) == [job, child]
    # And gpu-holders by itself, with no scope to spare it: it is no holder of GPU5.
    playbook = tmp_path / "holders.yaml"
    playbook.write_text("name: holders\nstages:\n  - name: kill-gpu-holders\n"
                        "    type: gpu-holders\n    filter: ^sglang-data-worker\n"
                        "    match: cmdline\n    grace: 1\nverify:\n  timeout: 1\n")
    res = cli("run", str(playbook), "-i", fleet.inventory_path, "--json")
    assert res.host("node01")["stages"][0]["matched"] == 0, res.host("node01")
    assert alive(fleet, "node01", [job, child]) == [job, child]

