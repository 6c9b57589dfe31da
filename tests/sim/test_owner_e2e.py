"""Owner attribution over SSH on simulated nodes with one process of each kind (issue 14):
``owner.sh`` runs in the node as fleetclean sends it (``bash -s`` over real OpenSSH) and
names each process's owner as the node's own tools (docker, crictl, Slurm) name it.

Two one-node fleets: cgroup mode auto (v2 here and on CI: systemd drivers, Slurm steps in
slurmstepd.scope) and v1 (cgroupfs drivers, Slurm's own cgroup/v1 plugin); with Slurm
where it is installed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from simhelp import down_checked, module_subnet
from slurmhelp import SLURM_SKIP_REASON

from fleetclean.engine.stages import template
from fleetclean.errors import SimError
from fleetclean.models import Owner
from fleetclean.sim import SimFleet
from fleetclean.sim import cgroups as sim_cgroups

pytestmark = pytest.mark.sim
HAS_SLURM = SLURM_SKIP_REASON is None


def _v1_why() -> str | None:
    try:
        sim_cgroups.plan("probe", "v1")
    except SimError as exc:
        return str(exc)
    return None


V1_SKIP = _v1_why()


@pytest.fixture(scope="module", params=["auto", "v1"])
def fleet(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    mode = str(request.param)
    if mode == "v1" and V1_SKIP:
        pytest.skip(f"no cgroup v1 here: {V1_SKIP}")
    if sim_cgroups.plan("probe").mode == "none":
        pytest.skip(f"no writable cgroup hierarchy: {sim_cgroups.plan('probe').why}")
    made = SimFleet.up(1, tmp_path_factory.mktemp(f"own{mode}"), subnet=module_subnet(),
                       cgroup=mode, slurm=HAS_SLURM)
    try:
        yield made
    finally:
        down_checked(made)


def node_sh(fleet: SimFleet, command: str) -> str:
    done = fleet.run_in("node01", ["sh", "-c", command])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def environ(fleet: SimFleet, pid: int) -> dict[str, str]:
    raw = fleet.node_path("node01", f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode().split("\0") if "=" in e)


def owners_over_ssh(fleet: SimFleet, pids: list[int]) -> dict[int, Owner]:
    script = template("lib.sh") + template("lib-stage.sh") + template("owner.sh") + (
        'fc_scan\nfor p in "$@"; do fc_owner "$p"\n'
        'printf "%s\\t%s\\t%s\\t%s\\n" "$p" "$FC_OWNER_KIND" "$FC_OWNER_ID" "$FC_OWNER_NAME"\n'
        "done\n")
    done = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), "node01", "bash", "-s", "--",
         *map(str, pids)], input=script, capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    return {int(r[0]): Owner(r[1], r[2], r[3]) for r in rows}


def spawn_each_kind(fleet: SimFleet) -> dict[str, tuple[list[int], Owner]]:
    """One workload of each kind, and the owner the node's own tools give it."""
    want: dict[str, tuple[list[int], Owner]] = {}
    vllm = fleet.spawn("node01", "service", unit="vllm", run="vllm", gpus="0")
    want["service"] = (vllm, Owner("systemd", "vllm.service", "vllm.service"))
    (note,) = fleet.spawn("node01", "service", unit="notebook", uid=0, gpus="1")
    want["user service"] = (
        [note], Owner("systemd", "user@0.service/notebook.service", "notebook.service"))
    (ctr,) = fleet.spawn("node01", "container", container="sgl", restart="always", gpus="2")
    cid = node_sh(fleet, "docker inspect -f '{{.Id}}' sgl")
    want["container"] = ([ctr], Owner("docker", cid, cid[:12]))
    (pod,) = fleet.spawn("node01", "pod", pod="llm-0", qos="guaranteed", gpus="3")
    pcid = node_sh(fleet, "crictl ps -q")
    uid = node_sh(fleet, "crictl inspect -o go-template --template "
                  f"'{{{{index .status.labels \"io.kubernetes.pod.uid\"}}}}' {pcid}")
    want["pod"] = ([pod], Owner("kubernetes", uid, pcid))
    (pane,) = fleet.spawn("node01", "tmux", session="train", gpus="4")
    server = next(p.ppid for p in fleet.processes("node01") if p.pid == pane)
    want["tmux"] = ([pane], Owner("tmux", str(server), "$" + environ(fleet, pane)["TMUX"][-1]))
    (scr,) = fleet.spawn("node01", "screen", session="eval", gpus="5")
    sty = environ(fleet, scr)["STY"]
    want["screen"] = ([scr], Owner("screen", sty.split(".")[0], sty))
    (plain,) = fleet.spawn("node01", "holder", gpus="6")
    want["plain"] = ([plain], Owner("plain"))
    started = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), "node01",
         "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, timeout=30, check=True)
    want["ssh session"] = ([int(started.stdout)], Owner("systemd", "ssh.service", "ssh.service"))
    if HAS_SLURM:
        (job,) = fleet.spawn("node01", "slurm-job", gpus="7")
        jid = environ(fleet, job)["SLURM_JOB_ID"]
        want["slurm job"] = ([job], Owner("slurm", jid, f"{jid}.batch"))
    return want


def test_a_slurm_jobs_gpu_process_is_in_the_jobs_cgroup(fleet: SimFleet) -> None:
    if not HAS_SLURM:
        pytest.skip(SLURM_SKIP_REASON or "")
    (task,) = fleet.spawn("node01", "slurm-job", gpus="7", job_name="cg-check")
    job = environ(fleet, task)["SLURM_JOB_ID"]
    lines = node_sh(fleet, f"cat /proc/{task}/cgroup").splitlines()
    if fleet.cgroup_mode == "v2":
        want = f"0::/system.slice/slurmstepd.scope/job_{job}/step_batch/user/task_0"
        assert want in lines
    else:  # Slurm's own cgroup/v1 plugin: task/cgroup (cpuset), jobacct_gather (memory)
        memory = next(line for line in lines if line.split(":")[1] == "memory")
        assert memory.endswith(f"/uid_0/job_{job}/step_batch/task_0")
        assert memory.split(":")[2].startswith("/slurm")
    node_sh(fleet, f"kill {task}")


def test_attribution_over_ssh_names_each_owner(fleet: SimFleet) -> None:
    want = spawn_each_kind(fleet)
    got = owners_over_ssh(fleet, [p for pids, _ in want.values() for p in pids])
    wrong = {kind: {p: got[p] for p in pids if got[p] != owner}
             for kind, (pids, owner) in want.items()}
    assert {k: v for k, v in wrong.items() if v} == {}
    if not HAS_SLURM:
        pytest.skip(f"the Slurm job was left out: {SLURM_SKIP_REASON}")
