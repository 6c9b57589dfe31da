"""The simulated fleet's real Slurm: nodes register idle, jobs run under slurmstepd inside
the nodes, and ``sim down`` leaves no Slurm or munge process behind."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from simhelp import Cli, down_checked, module_subnet
from slurmhelp import needs_slurm, slurm_cmd, submit_gpu_holder, wait_for

from fleetclean.sim import SimFleet, pids
from fleetclean.sim import slurm as sim_slurm

pytestmark = [pytest.mark.sim, pytest.mark.slurm, needs_slurm]


@pytest.fixture(scope="module")
def slurm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    fleet = SimFleet.up(2, tmp_path_factory.mktemp("slurm"), subnet=module_subnet(), slurm=True)
    try:
        yield fleet
    finally:
        down_checked(fleet)


def test_sinfo_shows_every_node_idle_in_both_partitions(slurm_fleet: SimFleet) -> None:
    done = slurm_cmd(slurm_fleet, "sinfo", "-N", "-h", "-o", "%N|%P|%T|%G")
    assert done.returncode == 0, done.stderr
    rows = sorted(done.stdout.split())
    assert rows == [
        "node01|debug|idle|gpu:8",
        "node01|gpu*|idle|gpu:8",
        "node02|gpu*|idle|gpu:8",
    ]


def test_srun_runs_in_the_node_under_its_own_hostname(slurm_fleet: SimFleet) -> None:
    done = slurm_cmd(slurm_fleet, "srun", "-w", "node02", "--gres=gpu:1", "hostname")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "node02"


def test_a_job_holding_a_gpu_runs_under_slurmstepd_in_the_node(slurm_fleet: SimFleet) -> None:
    job = submit_gpu_holder(slurm_fleet, "node01", gpu=5, mib=4096)
    try:
        assert wait_for(lambda: slurm_fleet.gpu_used_mib("node01")[5:6] == [4096])
        procs = {p.pid: p for p in slurm_fleet.processes("node01")}
        holder = next(p for p in procs.values() if "/dev/nvidia5" in p.cmdline)
        parent = procs[holder.ppid]
        assert parent.cmdline == f"slurmstepd: [{job}.batch]"
        state = slurm_cmd(slurm_fleet, "squeue", "-h", "-j", str(job), "-o", "%T %N").stdout
        assert state.split() == ["RUNNING", "node01"]
    finally:
        slurm_cmd(slurm_fleet, "scancel", str(job))
    assert wait_for(lambda: slurm_fleet.gpu_used_mib("node01") == [0] * 8)


def _pgrep(name: str) -> set[int]:
    done = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return {int(p) for p in done.stdout.split()}


def test_sim_down_stops_every_slurm_daemon_and_job(
    cli: Cli, tmp_path: Path, sim_subnet: int, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "fleet"
    up = cli("sim", "up", "--nodes", "2", "--slurm", "--state-dir", state,
             "--subnet", str(sim_subnet))
    fleet = SimFleet.load(state)
    try:
        assert up.code == 0, up.err
        printed = capsys.readouterr().out  # the sim commands print to the process's stdout
        assert f"export SLURM_CONF={state.resolve()}/shared/slurm/slurm.conf" in printed
        submit_gpu_holder(fleet, "node02", gpu=0, mib=1024)
        assert wait_for(lambda: fleet.gpu_used_mib("node02")[0] == 1024)
        procs = fleet.processes("node02")
        steps = [p.host_pid for p in procs if p.cmdline.startswith("slurmstepd")]
        assert steps
        recorded = pids.load(fleet.layout.pid_file)
        roles = {e.role.split(":")[0] for e in recorded}
        assert {"munged", "slurmctld", "slurmd"} <= roles
    finally:
        down = cli("sim", "down", "--state-dir", state)
    assert down.code == 0, down.err
    assert not [e for e in recorded if pids.is_alive(e)]
    started = {e.pid for e in recorded} | set(steps)
    # A killed daemon lingers a moment as a zombie until this machine's init reaps it.
    for name in ("munged", "slurmctld", "slurmd", "slurmstepd"):
        assert wait_for(lambda n=name: not (_pgrep(n) & started), timeout=10), name
    assert not sim_slurm.has_slurm(state)
