"""``fleetclean export slurm-epilog``, installed as slurm.conf's ``Epilog=`` in the simulated
fleet's real Slurm: slurmd runs it (as root, with no PATH) after every job.

The nodes' GPU minors differ from nvidia-smi's order (GPU i is /dev/nvidia{MINORS[i]}), as
on boards whose driver probed GPUs out of bus order: Slurm's GPU ids (SLURM_JOB_GPUS) are
minors, never indexes. Jobs leave GPU holders behind the way real ones do: a worker that
daemonized out of its step (proctrack/linuxproc loses it; it still has the job's
SLURM_JOB_ID)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, down_checked, module_subnet
from slurmhelp import needs_slurm, node_idle, slurm_cmd, wait_for

from fleetclean.sim import SimFleet, uvm_count
from fleetclean.sim import slurm as sim_slurm

pytestmark = [pytest.mark.sim, pytest.mark.slurm, needs_slurm]
MINORS = [1, 0, 3, 2, 5, 4, 7, 6]
EPILOG = Path("epilog/fleetclean")
LOG = "/run/fleetclean/epilog.log"  # the node's own dir: its host path is node.dir/...
ORPHAN = "orphan-worker"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    sim = SimFleet.up(3, tmp_path_factory.mktemp("epilog"), subnet=module_subnet(), slurm=True,
                      slurm_epilog=EPILOG, gpu_minors=MINORS)
    try:
        yield sim
    finally:
        down_checked(sim)


def install(fleet: SimFleet, cli: Cli, *extra: str) -> str:
    """Export the epilog where slurm.conf's Epilog= names it; its text."""
    res = cli("export", "slurm-epilog", "post-extraction", "-e", f"epilog_log={LOG}",
              "-e", "verify_timeout=2", *extra)
    assert res.code == 0, res.err
    path = fleet.shared_dir / EPILOG
    path.write_text(res.out)
    path.chmod(0o755)
    return res.out


class Job:
    """An sbatch job on one node that holds one GPU (``--gres=gpu:1``) until told to end;
    with ``orphan``, it leaves a worker behind that holds that GPU and outlives it."""

    def __init__(self, fleet: SimFleet, node: str, *, orphan: bool) -> None:
        self.fleet, self.node = fleet, node
        leave = (f"( FLEETCLEAN_SIM_GPU_MIB=4096 setsid python3 -c 'import os, time; "
                 f"f = open(\"/dev/nvidia\" + os.environ[\"SLURM_JOB_GPUS\"]); "
                 f"u = open(\"/dev/nvidia-uvm\"); {uvm_count.OPENED_PY}; time.sleep(3600)' "
                 f"{ORPHAN} & )\n"
                 if orphan else "")
        script = ("#!/bin/bash\n"
                  "echo \"$SLURM_JOB_GPUS\" > /run/fleetclean/job-$SLURM_JOB_ID.gpus\n"
                  f"{leave}"
                  "while [ ! -e /run/fleetclean/go-$SLURM_JOB_ID ]; do sleep 0.05; done\n")
        done = slurm_cmd(fleet, "sbatch", "--parsable", "-w", node, "--gres=gpu:1",
                         "-o", "/dev/null", "--wrap", script)
        assert done.returncode == 0, done.stderr
        self.id = int(done.stdout.strip().split(";")[0])
        gpus = fleet.node(node).dir / f"job-{self.id}.gpus"
        assert wait_for(lambda: gpus.exists() and gpus.read_text().strip() != "")
        self.minor = int(gpus.read_text().strip())
        self.index = MINORS.index(self.minor)  # the GPU nvidia-smi shows it on
        if orphan:
            assert wait_for(lambda: fleet.gpu_used_mib(node)[self.index] == 4096)

    def end(self) -> None:
        (self.fleet.node(self.node).dir / f"go-{self.id}").touch()


def orphans(fleet: SimFleet, node: str) -> list[int]:
    return [p.pid for p in fleet.processes(node) if p.cmdline.endswith(ORPHAN)]


def state(fleet: SimFleet, node: str) -> str:
    return sim_slurm.node_states(fleet.state_dir).get(node, "")


def settled(fleet: SimFleet, node: str) -> bool:
    """The epilog is done: the node is idle again, or drained for good."""
    return state(fleet, node) == "idle" or state(fleet, node).startswith("drain")


def epilog_ran(fleet: SimFleet, node: str, job: int) -> bool:
    """The epilog of ``job`` has written its last line on ``node``."""
    log = fleet.node(node).dir / "epilog.log"
    return log.exists() and f"fleetclean: {node} job {job}: " in log.read_text()


def essentials(host: dict[str, Any], stages: set[str]) -> dict[str, Any]:
    return {
        "status": host["status"],
        "error": host["error"],
        "gpus": host["gpus"],
        "signalled": sorted((s["cmdline"], s["signal"]) for s in host["signalled"]),
        "stages": [(s["name"], s["status"]) for s in host["stages"] if s["name"] in stages],
    }


def test_the_epilog_kills_what_a_job_left_on_its_gpu_and_the_node_returns_idle(
    fleet: SimFleet, cli: Cli
) -> None:
    install(fleet, cli)
    job = Job(fleet, "node01", orphan=True)
    job.end()
    assert wait_for(lambda: settled(fleet, "node01"))
    assert state(fleet, "node01") == "idle"
    assert orphans(fleet, "node01") == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    # What it did is in its log, read as a run's results.
    log = fleet.node("node01").dir / "epilog.log"
    res = cli("report", "--json", log)
    assert res.code == 0, res.out
    host = res.host("node01")
    assert host["status"] == "clean"
    leftovers = next(s for s in host["stages"] if s["name"] == "job-leftovers")
    assert (leftovers["matched"], leftovers["signalled"]) == (1, 1)
    assert [s["cmdline"].endswith(ORPHAN) for s in host["signalled"]] == [True]
    assert log.read_text().rstrip().endswith(f"fleetclean: node01 job {job.id}: clean")


def test_the_epilog_report_matches_a_run_over_ssh_on_the_same_leftover(
    fleet: SimFleet, cli: Cli
) -> None:
    # Over SSH: no epilog; the same job leaves the same worker, fleetclean run cleans it.
    (fleet.shared_dir / EPILOG).write_text("#!/bin/sh\nexit 0\n")
    job = Job(fleet, "node03", orphan=True)
    job.end()
    assert wait_for(lambda: node_idle(fleet, "node03"))
    assert len(orphans(fleet, "node03")) == 1  # Slurm itself lost track of it
    ssh = cli("run", "post-extraction", "-i", fleet.inventory_path, "-l", "node03",
              "-e", "verify_timeout=2", "--json")
    assert ssh.code == 0, ssh.out
    # As the epilog: the same situation, cleaned by slurmd's run of the exported script.
    install(fleet, cli)
    job = Job(fleet, "node03", orphan=True)
    job.end()
    assert wait_for(lambda: settled(fleet, "node03"))
    epilog = cli("report", "--json", fleet.node("node03").dir / "epilog.log")
    assert epilog.code == ssh.code
    # Same hosts, status, GPU rows and signals; the playbook's own stages the same (the
    # epilog's extra first stage, job-leftovers, did what kill-gpu-holders did over SSH).
    common = {s["name"] for s in ssh.host("node03")["stages"]} - {"kill-gpu-holders"}
    assert [h["host"] for h in epilog.json()["hosts"]] == ["node03"]
    assert essentials(epilog.host("node03"), common) == essentials(ssh.host("node03"), common)
    assert epilog.json()["playbook"] == ssh.json()["playbook"]


def test_a_node_whose_gpu_stays_dirty_is_drained_by_slurm_with_fleetclean_s_reason(
    fleet: SimFleet, cli: Cli
) -> None:
    install(fleet, cli)
    job = Job(fleet, "node02", orphan=False)
    # Memory no kill frees, on the job's own GPU: the epilog must fail and Slurm drain.
    fleet.set_fault("node02", "leak", job.index, 3000)
    try:
        job.end()
        assert wait_for(lambda: settled(fleet, "node02"))
        assert state(fleet, "node02").startswith("drain")
        reasons = slurm_cmd(fleet, "sinfo", "-R", "-h", "-o", "%n|%E").stdout.splitlines()
        assert "node02|Epilog error" in reasons  # Slurm's own rule, from the exit status
        why = f"fleetclean: node02 job {job.id}: dirty: GPU{job.index} 3000 MiB"
        node = fleet.node("node02")
        assert (node.dir / "epilog.log").read_text().splitlines()[-1].startswith(why)
        assert why in (node.dir / "slurmd.log").read_text()  # slurmd logs a failed epilog's output
        res = cli("report", "--json", node.dir / "epilog.log")
        assert res.code == 1
        gpu = res.host("node02")["gpus"][job.index]
        assert (res.host("node02")["status"], gpu["memory_used_mib"]) == ("dirty", 3000)
    finally:
        fleet.set_fault("node02", "leak", job.index, 0)
        slurm_cmd(fleet, "scontrol", "update", "NodeName=node02", "State=RESUME")
    assert wait_for(lambda: node_idle(fleet, "node02"))


def test_on_a_shared_node_it_touches_only_the_finished_jobs_gpus_and_processes(
    fleet: SimFleet, cli: Cli
) -> None:
    install(fleet, cli)
    node = fleet.node("node03")
    done = Job(fleet, "node03", orphan=True)
    # The other job, still running on the same node: its GPU holder (called like a worker
    # the playbook's pattern stages stop) and its GPU must be left alone.
    other = slurm_cmd(fleet, "sbatch", "--parsable", "-w", "node03", "--gres=gpu:1",
                      "-o", "/dev/null", "--wrap",
                      "echo \"$SLURM_JOB_GPUS\" > /run/fleetclean/job-$SLURM_JOB_ID.gpus; "
                      "FLEETCLEAN_SIM_GPU_MIB=8192 exec python3 -c 'import os, time; "
                      "f = open(\"/dev/nvidia\" + os.environ[\"SLURM_JOB_GPUS\"]); "
                      f"u = open(\"/dev/nvidia-uvm\"); {uvm_count.OPENED_PY}; "
                      "time.sleep(3600)' sglang-worker-of-the-other-job")
    assert other.returncode == 0, other.stderr
    other_id = int(other.stdout.strip().split(";")[0])
    gpus = node.dir / f"job-{other_id}.gpus"
    try:
        assert wait_for(lambda: gpus.exists() and gpus.read_text().strip() != "")
        other_index = MINORS.index(int(gpus.read_text()))
        assert other_index != done.index
        assert wait_for(lambda: fleet.gpu_used_mib("node03")[other_index] == 8192)
        keep = [p.pid for p in fleet.processes("node03")
                if p.cmdline.endswith("sglang-worker-of-the-other-job")]
        assert len(keep) == 1

        done.end()
        assert wait_for(lambda: epilog_ran(fleet, "node03", done.id))
        assert orphans(fleet, "node03") == []
        used = fleet.gpu_used_mib("node03")
        assert (used[done.index], used[other_index]) == (0, 8192)
        assert [p.pid for p in fleet.processes("node03") if p.pid in keep] == keep
        # Clean, so not drained: the other job's GPU was shown, not judged.
        assert wait_for(lambda: state(fleet, "node03") in ("mixed", "allocated"))
        res = cli("report", "--json", node.dir / "epilog.log")
        host = res.host("node03")
        assert (res.code, host["status"], host["gpus_judged"]) == (0, "clean", [done.index])
        assert host["gpus"][other_index]["memory_used_mib"] == 8192
        assert all(s["pid"] not in keep for s in host["signalled"])
    finally:
        slurm_cmd(fleet, "scancel", str(other_id))
    assert wait_for(lambda: settled(fleet, "node03"))
    assert state(fleet, "node03") == "idle"  # after the other job's own epilog, clean too
