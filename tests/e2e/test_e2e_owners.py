"""Acting through the owner over SSH (issue 14): a ``Restart=always`` unit and a container
with a restart policy are stopped through systemd and docker and stay stopped, where
signals alone see them come back; a rootless container through its user's own daemon; a
pod's and a Slurm job's GPU processes are left running and the host is dirty with the
owner named and what to do; JSON names every owner.

One one-node fleet for the module (with Slurm where it is installed); each test uses GPUs
of its own and leaves the node idle: what it started is stopped through its own owner
(systemctl, docker, scancel) or by PID.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from simhelp import Cli, sh, spawn_holder, user_namespace_refusal
from slurmhelp import SLURM_SKIP_REASON, slurm_cmd, wait_for

from fleetclean.sim import SimFleet, accounts, uvm_count
from fleetclean.sim import cgroups as sim_cgroups

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(sim_cgroups.plan("probe").mode == "none",
                       reason=f"no writable cgroup hierarchy: {sim_cgroups.plan('probe').why}"),
]
Factory = Callable[..., SimFleet]
HAS_SLURM = SLURM_SKIP_REASON is None
FAST = ("-e", "verify_timeout=3")  # a respawn is dirty at once; no test waits 30 s for it
ALICE = accounts.user("alice").uid
ALICE_SOCK = f"/run/user/{ALICE}/docker.sock"  # her rootless daemon's
ALICE_DOCKER = f"docker -H unix://{ALICE_SOCK}"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    from simhelp import down_checked, module_subnet

    made = SimFleet.up(1, tmp_path_factory.mktemp("owners"), subnet=module_subnet(),
                       slurm=HAS_SLURM)
    try:
        yield made
    finally:
        down_checked(made)


UNITS = "ls /run/systemd/system 2>/dev/null | grep '^t-' || true"


@pytest.fixture
def fleet(shared: SimFleet) -> Iterator[SimFleet]:
    before = set(sh(shared, UNITS).split())
    yield shared
    # Through each owner first: a unit or container killed by PID would come back.
    for unit in set(sh(shared, UNITS).split()) - before:
        sh(shared, f"systemctl stop {unit}")
    sh(shared, "if command -v docker >/dev/null; then "
               "docker ps -q | xargs -r docker stop -t 0 >/dev/null; fi")
    # A user's rootless containers, through the user's own daemon: root's knows none.
    sh(shared, 'for s in /run/user/*/docker.sock; do [ -S "$s" ] || continue; '
               'docker -H "unix://$s" ps -q | xargs -r docker -H "unix://$s" stop -t 0 '
               ">/dev/null; done")
    if HAS_SLURM:
        slurm_cmd(shared, "scancel", "-u", "root")
    # By PID, inside the node: the workloads, their tmux and screen sessions.
    sh(shared, "ps -eo pid=,args= | awk '/gpu_worker|tmux|SCREEN/ && !/awk/ {print $1}' "
               "| xargs -r kill -KILL 2>/dev/null; true")
    assert wait_for(lambda: shared.gpu_used_mib("node01") == [0] * 8)


def running(fleet: SimFleet, pids: list[int]) -> list[int]:
    """The PIDs of ``pids`` that run in the node, as its own ps sees them."""
    out = sh(fleet, "ps -eo pid=")
    return [p for p in pids if str(p) in out.split()]


def holders(fleet: SimFleet, gpu: int) -> set[int]:
    done = fleet.run_in("node01", ["fuser", f"/dev/nvidia{gpu}"])
    return {int(p) for p in done.stdout.split()} - {fleet.persistenced_pid("node01")}


def run(cli: Cli, fleet: SimFleet, *extra: str) -> tuple[int, dict[str, Any]]:
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json", *extra)
    return done.code, done.host("node01")


def owners_of(host: dict[str, Any]) -> dict[int, dict[str, str]]:
    return {s["pid"]: s["owner"] for s in host["signalled"]}


def test_a_restart_always_unit_is_stopped_through_systemd_and_stays_stopped(
    fleet: SimFleet, cli: Cli
) -> None:
    (main,) = fleet.spawn("node01", "service", unit="t-trainer", gpus="0", mib=4096)
    code, host = run(cli, fleet)
    assert (code, host["status"], host["error"]) == (0, "clean", None)
    assert holders(fleet, 0) == set()
    assert sh(fleet, "systemctl show -p ActiveState,SubState t-trainer") == (
        "ActiveState=inactive\nSubState=dead")
    (entry,) = host["signalled"]
    assert entry["pid"] == main and entry["signal"] == "stop"
    assert entry["owner"] == {"kind": "systemd", "id": "t-trainer.service",
                              "name": "t-trainer.service"}
    # Nothing was left to come back: the verification did not wait out a settle.
    assert host["verify"] == {"rule": "clean"}


def test_a_unit_whose_main_process_only_watches_the_gpus_is_not_stopped(
    fleet: SimFleet, cli: Cli
) -> None:
    # An agent that watches the GPUs through NVML (every GPU's file, no /dev/nvidia-uvm)
    # and runs a training task in its unit: the task is the GPU holder, the unit is not
    # ours to stop (it was: its main process "held a GPU"), only the task is signalled.
    (agent,) = fleet.spawn("node01", "service", unit="t-agent", run="monitor")
    # The unit's directory in each hierarchy the node mounts (v2, or v1 and hybrid).
    dirs = sh(fleet, "find /sys/fs/cgroup -type d -name t-agent.service").split()
    if not dirs:
        pytest.skip("the unit has no cgroup directory in this node")
    task = spawn_holder(fleet, "node01", 0, 0, gpu=2, mib=2048, name="t-agent-task",
                        cgroups=dirs)
    try:
        code, host = run(cli, fleet, "-e", "owner_systemd=stop")
        assert running(fleet, [agent, task]) == [agent]
        assert sh(fleet, "systemctl show -p ActiveState --value t-agent") == "active"
        (entry,) = [s for s in host["signalled"] if s["pid"] == task]
        assert entry["signal"] != "stop" and entry["owner"]["id"] == "t-agent.service"
        assert (code, host["status"]) == (0, "clean"), host
    finally:
        sh(fleet, f"kill -KILL {task} 2>/dev/null; true")


def test_signals_alone_see_the_unit_come_back(fleet: SimFleet, cli: Cli) -> None:
    (main,) = fleet.spawn("node01", "service", unit="t-again", gpus="1", mib=4096)
    code, host = run(cli, fleet, "-e", "owner_systemd=signal", *FAST)
    assert (code, host["status"], host["verify"]["rule"]) == (1, "dirty", "respawn")
    assert [s["signal"] for s in host["signalled"] if s["pid"] == main] == ["TERM"]
    assert "respawned after it was killed" in host["error"]
    assert len(holders(fleet, 1) - {main}) == 1


def test_a_container_with_a_restart_policy_is_stopped_through_docker(
    fleet: SimFleet, cli: Cli
) -> None:
    (first,) = fleet.spawn("node01", "container", container="t-sgl", restart="always",
                           gpus="2", mib=2048)
    cid = sh(fleet, "docker inspect -f '{{.Id}}' t-sgl")
    code, host = run(cli, fleet)
    assert (code, host["status"]) == (0, "clean")
    assert holders(fleet, 2) == set()
    assert sh(fleet, "docker inspect -f '{{.State.Status}} {{.RestartCount}}' t-sgl") == (
        "exited 0")
    assert owners_of(host) == {first: {"kind": "docker", "id": cid, "name": cid[:12]}}
    assert [s["signal"] for s in host["signalled"]] == ["stop"]


def test_owner_docker_signal_is_the_old_behaviour_it_comes_back(
    fleet: SimFleet, cli: Cli
) -> None:
    (first,) = fleet.spawn("node01", "container", container="t-back", restart="always",
                           gpus="4", mib=2048)
    code, host = run(cli, fleet, "-e", "owner_docker=signal", *FAST)
    assert (code, host["status"], host["verify"]["rule"]) == (1, "dirty", "respawn")
    assert len(holders(fleet, 4) - {first}) == 1
    # The newcomer is named with its container in the GPU's processes.
    (proc,) = host["gpus"][4]["processes"]
    assert proc["owner"]["kind"] == "docker"
    assert f"(root; GPU4; docker {proc['owner']['name']})" in host["error"]


def skip_unless_rootless(fleet: SimFleet) -> None:
    """Rootless Docker as on a real node: a user namespace for its user (RootlessKit's),
    and cgroup v2, where systemd delegates the user's manager's subtree (on v1 a rootless
    daemon's containers have no cgroup of their own)."""
    refusal = user_namespace_refusal()
    if refusal:
        pytest.skip(refusal)
    if fleet.cgroup_mode != "v2":
        pytest.skip(f"rootless docker's systemd driver needs cgroup v2, not {fleet.cgroup_mode}")


def test_a_rootless_container_is_stopped_through_its_users_daemon(
    fleet: SimFleet, cli: Cli
) -> None:
    # Rootless Docker: alice's own daemon (her manager's docker.service, listening on her
    # /run/user/UID/docker.sock) runs the container, in a scope under user@UID.service.
    # fleetclean stopped it through root's daemon, which knows nothing of it: the stop
    # failed, the process was killed, and alice's daemon started the container again by
    # its restart policy, taking the GPU back. Root's own container beside it goes
    # through root's daemon, as before.
    skip_unless_rootless(fleet)
    (rootful,) = fleet.spawn("node01", "container", container="t-rootful", restart="always",
                             gpus="1", mib=2048)
    (first,) = fleet.spawn("node01", "container", container="t-rootless", rootless="alice",
                           restart="always", gpus="5", mib=2048)
    cid = sh(fleet, f"{ALICE_DOCKER} inspect -f '{{{{.Id}}}}' t-rootless")
    root_cid = sh(fleet, "docker inspect -f '{{.Id}}' t-rootful")
    assert sh(fleet, f"cat /proc/{first}/cgroup").endswith(
        f"/user@{ALICE}.service/user.slice/docker-{cid}.scope")
    assert sh(fleet, f"ps -o user= -p {first}") == "alice"
    unknown = fleet.run_in("node01", ["docker", "stop", cid])
    assert (unknown.returncode, unknown.stderr.strip()) == (
        1, f"Error response from daemon: No such container: {cid}")
    root_journal = "/run/fleetclean/journal/docker.service.log"
    before = len(sh(fleet, f"cat {root_journal}"))
    code, host = run(cli, fleet)
    assert (code, host["status"], host["warnings"]) == (0, "clean", []), host
    assert holders(fleet, 5) == set() and holders(fleet, 1) == set()
    # Stopped by hand through its own daemon: not restarted.
    assert sh(fleet, f"{ALICE_DOCKER} inspect -f '{{{{.State.Status}}}} {{{{.RestartCount}}}}' "
                     "t-rootless") == "exited 0"
    assert sh(fleet, "docker inspect -f '{{.State.Status}} {{.RestartCount}}' t-rootful") == (
        "exited 0")
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert owners_of(host)[first] == {"kind": "docker", "id": cid, "name": cid[:12]}
    assert {s["pid"]: s["signal"] for s in host["signalled"]} == {first: "stop",
                                                                  rootful: "stop"}
    # Each daemon was asked about its own container only (their API calls, as dockerd
    # --debug logs them to the unit's journal).
    root_calls = sh(fleet, f"cat {root_journal}")[before:]
    user_calls = sh(fleet, f"cat /run/fleetclean/journal/user@{ALICE}.service/"
                           "docker.service.log")
    assert cid not in root_calls
    assert f"POST /v1.47/containers/{root_cid}/stop?t=" in root_calls
    assert f"POST /v1.47/containers/{cid}/stop?t=" in user_calls
    assert host["verify"] == {"rule": "clean"}


def test_a_rootless_container_whose_daemon_does_not_answer_is_signalled_and_watched(
    fleet: SimFleet, cli: Cli
) -> None:
    # Alice's daemon runs the container but does not answer on her runtime dir's socket
    # (moved away here: no socket there, nothing asked): no stop can work. Its process is
    # signalled, the verification watches the container for the restart its policy makes,
    # and the warning names the daemon and what to run.
    skip_unless_rootless(fleet)
    (first,) = fleet.spawn("node01", "container", container="t-unheard", rootless="alice",
                           restart="always", gpus="4", mib=2048)
    cid = sh(fleet, f"{ALICE_DOCKER} inspect -f '{{{{.Id}}}}' t-unheard")
    sh(fleet, f"mv {ALICE_SOCK} {ALICE_SOCK}.away")
    try:
        code, host = run(cli, fleet, *FAST)
    finally:
        sh(fleet, f"mv {ALICE_SOCK}.away {ALICE_SOCK}")
    assert (code, host["status"], host["verify"]["rule"]) == (1, "dirty", "respawn"), host
    assert [s["signal"] for s in host["signalled"] if s["pid"] == first] == ["TERM"]
    assert "started again by its owner" in host["error"]
    assert len(holders(fleet, 4) - {first}) == 1
    (warning,) = host["warnings"]
    assert warning.startswith(f"docker {cid[:12]} (rootless, uid {ALICE} alice): its daemon at "
                              f"unix://{ALICE_SOCK} did not answer for it (no socket of its "
                              f"own at {ALICE_SOCK})"), warning
    assert warning.endswith(f"to stop it: {ALICE_DOCKER} stop {cid[:12]}"), warning


def test_a_gpu_job_docker_exec_started_is_killed_and_its_container_left_running(
    fleet: SimFleet, cli: Cli
) -> None:
    # A dev container whose main process sleeps, and a GPU job someone started in it with
    # `docker exec`: the job is the container's by its cgroup, but not its main process's
    # (its parent is the shim), and no restart policy brings it back. `docker stop` took
    # the whole container down for it; only the job is killed now, by its PID.
    (main,) = fleet.spawn("node01", "container", container="t-dev", restart="always",
                          run="holder", gpus="", name="sleep infinity")
    cid = sh(fleet, "docker inspect -f '{{.Id}}' t-dev")
    minor = json.loads((fleet.node("node01").dir / "gpus.json").read_text())["gpus"][6]["minor"]
    code = (f"import time; f = open('/dev/nvidia{minor}'); u = open('/dev/nvidia-uvm'); "
            f"{uvm_count.OPENED_PY}; time.sleep(3600)")
    sh(fleet, f"docker exec -d -e FLEETCLEAN_SIM_GPU_MIB=2048 t-dev python3 -c \"{code}\" "
              "t-dev-serve")
    assert wait_for(lambda: fleet.gpu_used_mib("node01")[6] == 2048)
    (job,) = holders(fleet, 6)
    checked = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert (f"would send TERM to {job} (python3 -c {code} t-dev-serve), owner docker "
            f"{cid[:12]} (started by docker exec, not its main process {main})") in checked.out
    assert "would stop docker" not in checked.out
    code_, host = run(cli, fleet)
    assert (code_, host["status"]) == (0, "clean"), host
    assert running(fleet, [main, job]) == [main]
    assert sh(fleet, "docker inspect -f '{{.State.Pid}} {{.State.Status}} {{.RestartCount}}' "
                     "t-dev") == f"{main} running 0"
    assert fleet.gpu_used_mib("node01") == [0] * 8
    (entry,) = host["signalled"]
    assert (entry["pid"], entry["signal"]) == (job, "TERM")
    assert entry["owner"] == {"kind": "docker", "id": cid, "name": cid[:12]}
    # Nothing starts it again: the containerd-shim above it is no parent left running.
    assert host["left_running"] == [] and host["warnings"] == []


def test_a_pods_gpu_process_is_left_running_and_the_pod_named(
    fleet: SimFleet, cli: Cli
) -> None:
    (pod,) = fleet.spawn("node01", "pod", pod="llm-0", namespace="ml", gpus="3", mib=4096,
                         restart_policy="Never")
    checked = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert (f"kill-gpu-holders: would refuse: pod ml/llm-0 (kubectl delete pod -n ml llm-0): "
            f"{pod} (") in checked.out
    code, host = run(cli, fleet)
    assert (code, host["status"], host["verify"]["rule"]) == (1, "dirty", "refused")
    assert running(fleet, [pod]) == [pod]
    assert host["signalled"] == []
    assert "not signalled, left to its owner: pod ml/llm-0" in host["error"]
    assert "kubectl delete pod -n ml llm-0" in host["error"]
    (refusal,) = host["refused"]
    assert refusal["pid"] == pod and refusal["owner"]["kind"] == "kubernetes"
    (proc,) = host["gpus"][3]["processes"]
    assert proc["owner"] == refusal["owner"]
    assert "(root; GPU3; pod ml/llm-0)" in host["error"]


def test_a_slurm_jobs_gpu_process_is_left_running_and_the_job_named(
    fleet: SimFleet, cli: Cli
) -> None:
    if not HAS_SLURM:
        pytest.skip(SLURM_SKIP_REASON or "")
    (task,) = fleet.spawn("node01", "slurm-job", gpus="5", mib=4096, job_name="t-job")
    code, host = run(cli, fleet)
    assert (code, host["status"]) == (1, "dirty")
    assert running(fleet, [task]) == [task]
    (refusal,) = host["refused"]
    job = refusal["owner"]["id"]
    assert refusal["who"] == f"Slurm job {job} (user root)"
    assert f"scancel {job}" in host["error"]


def slurm_job_on_gpu5(fleet: SimFleet, name: str) -> tuple[int, str]:
    """An sbatch job ``name`` whose task holds 4,096 MiB of GPU5: (its task's PID, the job
    id its environment names); the test is skipped where Slurm is not installed."""
    if not HAS_SLURM:
        pytest.skip(SLURM_SKIP_REASON or "")
    (task,) = fleet.spawn("node01", "slurm-job", gpus="5", mib=4096, job_name=name)
    job = sh(fleet, f"tr '\\0' '\\n' < /proc/{task}/environ | sed -n 's/^SLURM_JOB_ID=//p'")
    assert job.isdigit()
    return task, job


def test_owner_slurm_stop_cancels_the_job_and_its_gpu_is_freed(
    fleet: SimFleet, cli: Cli
) -> None:
    # owner_slurm=stop: the job is cancelled from the node (its own scancel and
    # slurm.conf, the real slurmctld's answer), not its task signalled behind Slurm's back
    # (the job would run on, its step's next task taking the GPU). The task is gone, every
    # GPU reads 0 MiB, Slurm has the job as CANCELLED.
    task, job = slurm_job_on_gpu5(fleet, "t-cancel")
    checked = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check",
                  "-e", "owner_slurm=stop")
    assert f"would stop Slurm job {job} (scancel {job}): {task} (" in checked.out
    code, host = run(cli, fleet, "-e", "owner_slurm=stop")
    assert (code, host["status"], host["error"]) == (0, "clean", None)
    assert (task, "stop") in {(s["pid"], s["signal"]) for s in host["signalled"]}
    assert running(fleet, [task]) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert wait_for(lambda: "JobState=CANCELLED" in slurm_cmd(
        fleet, "scontrol", "show", "job", job).stdout)
    assert owners_of(host)[task]["kind"] == "slurm" and owners_of(host)[task]["id"] == job


def test_owner_slurm_stop_cancels_only_what_the_processs_own_user_may(
    fleet: SimFleet, cli: Cli
) -> None:
    # A process of alice's that names root's running job (SLURM_JOB_ID in its own
    # environment, which anyone may set) was taken for that job's and root ran scancel on
    # it: root's job ended, on every node it ran on. scancel now runs as alice: slurmctld
    # refuses, root's job runs on, and alice's process is signalled as any other.
    if not HAS_SLURM:
        pytest.skip(SLURM_SKIP_REASON or "")
    job = slurm_cmd(fleet, "sbatch", "--parsable", "-w", "node01", "-o", "/dev/null",
                    "-J", "t-victim", "--wrap", "sleep 600").stdout.strip()
    assert job.isdigit() and wait_for(lambda: "JobState=RUNNING" in slurm_cmd(
        fleet, "scontrol", "show", "job", job).stdout)
    forged = spawn_holder(fleet, "node01", ALICE, ALICE, gpu=4, mib=1024, name="t-forged",
                          env={"SLURM_JOB_ID": job})
    try:
        code, host = run(cli, fleet, "-e", "owner_slurm=stop")
        assert running(fleet, [forged]) == []
        assert "JobState=RUNNING" in slurm_cmd(fleet, "scontrol", "show", "job", job).stdout
        assert any(f"scancel {job} failed" in w for w in host["warnings"]), host["warnings"]
        assert (code, host["status"]) == (0, "clean")
    finally:
        sh(fleet, f"kill -KILL {forged} 2>/dev/null; true")
        slurm_cmd(fleet, "scancel", job)


def test_a_jobs_process_outside_its_cgroup_is_the_jobs_while_the_job_runs(
    fleet: SimFleet, cli: Cli
) -> None:
    # A job's worker that left its job's cgroup and slurmstepd's tree (a double-forked
    # daemon; proctrack/linuxproc) keeps SLURM_JOB_ID: it was named plain and killed under
    # owner_slurm=refuse while its job ran. Where the job is over, it is a stray: killed.
    task, job = slurm_job_on_gpu5(fleet, "t-out")
    out = spawn_holder(fleet, "node01", 0, 0, gpu=4, mib=1024, name="t-outside",
                       env={"SLURM_JOB_ID": job})
    stray = spawn_holder(fleet, "node01", 0, 0, gpu=3, mib=1024, name="t-stray",
                         env={"SLURM_JOB_ID": "999999"})
    try:
        code, host = run(cli, fleet)
        assert (code, host["status"]) == (1, "dirty")
        assert running(fleet, [task, out, stray]) == [task, out]
        refused = {r["pid"]: r["owner"] for r in host["refused"]}
        assert refused[out] == {"kind": "slurm", "id": job, "name": job}
        assert stray in {s["pid"] for s in host["signalled"]}
    finally:  # the fixture's clean-up knows the supervisors' processes, not these
        sh(fleet, f"kill -KILL {out} {stray} 2>/dev/null; true")


def test_check_says_what_would_be_stopped(fleet: SimFleet, cli: Cli) -> None:
    (main,) = fleet.spawn("node01", "service", unit="t-look", gpus="6", mib=1024)
    (pane,) = fleet.spawn("node01", "tmux", session="t-train", gpus="7", mib=1024)
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert ("kill-gpu-holders: would stop t-look.service (systemctl stop t-look.service): "
            f"{main} (") in done.out
    assert f"would send TERM to {pane} (" in done.out
    assert ", owner tmux $" in done.out
    assert running(fleet, [main, pane]) == [main, pane]
