"""The simulated nodes' supervisors behave as the real ones (issue 14): a ``Restart=always``
unit and a container with a restart policy come back after a signal and stay down after
``systemctl stop``/``docker stop``/``docker kill``; a user's rootless daemon runs its own
containers, which root's does not know; a pod's container is replaced; every process
reads node-relative cgroup paths; ``sim down`` leaves no cgroup and no process.

One two-node fleet for the module (cgroup mode auto: v2 here and on CI); each test uses
GPUs of its own on node01. Everything is taken down by PID whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from simhelp import down_checked, module_subnet, sh, up_claimed, user_namespace_refusal

from fleetclean.errors import SimError
from fleetclean.sim import SimFleet, accounts, launcher
from fleetclean.sim import cgroups as sim_cgroups
from fleetclean.sim import node as sim_node

pytestmark = pytest.mark.sim
NEEDS_CGROUPS = pytest.mark.skipif(
    sim_cgroups.plan("probe").mode == "none",
    reason=f"no writable cgroup hierarchy here: {sim_cgroups.plan('probe').why}",
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    made = SimFleet.up(2, tmp_path_factory.mktemp("sup"), subnet=module_subnet())
    try:
        yield made
    finally:
        down_checked(made)


def holders(fleet: SimFleet, gpu: int, node: str = "node01") -> set[int]:
    """The workloads holding /dev/nvidiaGPU: every holder but the node's persistenced."""
    done = fleet.run_in(node, ["fuser", f"/dev/nvidia{gpu}"])
    return {int(p) for p in done.stdout.split()} - {fleet.persistenced_pid(node)}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def show(fleet: SimFleet, unit: str, *props: str) -> dict[str, str]:
    out = sh(fleet, f"systemctl show -p {','.join(props)} {unit}")
    return dict(line.split("=", 1) for line in out.splitlines())


def test_restart_always_unit_comes_back_after_a_signal_and_stays_stopped(fleet: SimFleet) -> None:
    (main,) = fleet.spawn("node01", "service", unit="trainer", gpus="0", mib=4096)
    assert holders(fleet, 0) == {main}
    assert show(fleet, "trainer", "MainPID", "ActiveState") == {
        "MainPID": str(main), "ActiveState": "active"}
    sh(fleet, f"kill -KILL {main}")
    # A new process of the unit holds the GPU again (RestartSec is 100 ms).
    assert wait_for(lambda: len(holders(fleet, 0) - {main}) == 1)
    (again,) = holders(fleet, 0)
    assert show(fleet, "trainer", "MainPID", "NRestarts") == {
        "MainPID": str(again), "NRestarts": "1"}
    sh(fleet, "systemctl stop trainer")
    assert holders(fleet, 0) == set()
    state = show(fleet, "trainer", "MainPID", "ActiveState", "SubState")
    # inactive (dead), not activating (auto-restart): nothing will start it again
    assert state == {"MainPID": "0", "ActiveState": "inactive", "SubState": "dead"}
    assert fleet.run_in("node01", ["systemctl", "is-active", "trainer"]).returncode == 3


def test_stop_while_a_crashed_unit_goes_down_leaves_it_stopped(fleet: SimFleet) -> None:
    # Its main process killed, the unit's worker takes 2 s to go on SIGTERM: the stop comes
    # while the unit is still going down after the crash, before any restart.
    main, worker = fleet.spawn("node01", "service", unit="crashy", run="respawn", gpu=6,
                               delay=2)
    sh(fleet, f"kill -KILL {main}")
    assert wait_for(lambda: show(fleet, "crashy", "ActiveState")["ActiveState"] == "deactivating")
    sh(fleet, "systemctl stop crashy")
    assert show(fleet, "crashy", "ActiveState", "SubState", "NRestarts") == {
        "ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"}
    assert holders(fleet, 6) == set()
    assert not {p.pid for p in fleet.processes("node01")} & {main, worker}


def test_restart_no_unit_stays_down_after_a_signal(fleet: SimFleet) -> None:
    (main,) = fleet.spawn("node01", "service", unit="oneshot", restart="no", gpus="1")
    sh(fleet, f"kill -KILL {main}")
    assert wait_for(lambda: show(fleet, "oneshot", "ActiveState")["ActiveState"] == "failed")
    assert holders(fleet, 1) == set()
    assert show(fleet, "oneshot", "Result", "ExecMainStatus") == {
        "Result": "signal", "ExecMainStatus": "9"}


def test_container_restarts_after_a_signal_but_not_after_docker_stop_or_kill(
    fleet: SimFleet,
) -> None:
    (first,) = fleet.spawn("node01", "container", container="worker", restart="always",
                           gpus="2")
    inspect = "docker inspect -f '{{.State.Pid}} {{.RestartCount}} {{.State.Status}}' worker"
    assert sh(fleet, inspect) == f"{first} 0 running"
    sh(fleet, f"kill -TERM {first}")
    assert wait_for(lambda: len(holders(fleet, 2) - {first}) == 1)
    (second,) = holders(fleet, 2)
    assert sh(fleet, inspect) == f"{second} 1 running"
    assert sh(fleet, "docker stop -t 5 worker") == "worker"
    assert holders(fleet, 2) == set()
    assert sh(fleet, inspect) == "0 1 exited"
    (other,) = fleet.spawn("node01", "container", container="other", restart="unless-stopped",
                           gpus="3")
    assert holders(fleet, 3) == {other}
    assert sh(fleet, "docker kill other") == "other"
    assert holders(fleet, 3) == set()
    assert sh(fleet, "docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' other") == \
        "exited 137"


def test_docker_cli_lists_and_refuses_as_the_real_one(fleet: SimFleet) -> None:
    fleet.spawn("node01", "container", container="lister", image="vllm/vllm-openai:v0.6.3",
                gpus="4")
    table = sh(fleet, "docker ps").splitlines()
    assert table[0].split() == ["CONTAINER", "ID", "IMAGE", "COMMAND", "CREATED", "STATUS",
                                "PORTS", "NAMES"]
    row = next(line for line in table if line.endswith(" lister"))
    cid = sh(fleet, "docker ps --no-trunc --format '{{.ID}} {{.Names}}' | grep lister")
    assert row.startswith(cid.split()[0][:12] + "   vllm/vllm-openai:v0.6.3")
    doc = json.loads(sh(fleet, "docker inspect lister"))
    assert doc[0]["Name"] == "/lister" and doc[0]["HostConfig"]["RestartPolicy"]["Name"] == "no"
    missing = fleet.run_in("node01", ["docker", "stop", "nosuch"])
    assert (missing.returncode, missing.stderr.strip()) == (
        1, "Error response from daemon: No such container: nosuch")


def proc_status(fleet: SimFleet, pid: int, field: str) -> list[str]:
    line = sh(fleet, f"grep '^{field}:' /proc/{pid}/status")
    return line.split()[1:]


def test_docker_exec_runs_beside_the_main_process_as_the_real_one(fleet: SimFleet) -> None:
    # A dev container whose main process sleeps; a command `docker exec`'d into it lives in
    # the container's cgroup and PID namespace, a child of the shim (as the main process
    # is), not of the main process; nothing starts it again when it dies.
    (main,) = fleet.spawn("node01", "container", container="dev", run="holder", gpus="",
                          name="sleep infinity")
    assert sh(fleet, "docker inspect -f '{{.State.Pid}}' dev") == str(main)
    assert sh(fleet, "docker exec -e GREETING=hi -w /tmp dev sh -c 'echo $GREETING $PWD'") \
        == "hi /tmp"
    status = fleet.run_in("node01", ["docker", "exec", "dev", "sh", "-c", "exit 3"])
    assert (status.returncode, status.stdout) == (3, "")
    sh(fleet, "docker exec -d dev bash -c 'exec -a exec-sleeper sleep 300'")
    assert wait_for(lambda: sh(fleet, "pgrep -f '^exec-sleeper' || true") != "")
    (execd,) = map(int, sh(fleet, "pgrep -f '^exec-sleeper'").split())
    shim = int(proc_status(fleet, main, "PPid")[0])
    assert "containerd-shim-runc-v2 -namespace moby -id" in sh(fleet, f"ps -o args= -p {shim}")
    assert int(proc_status(fleet, execd, "PPid")[0]) == shim
    assert sh(fleet, f"cat /proc/{execd}/cgroup") == sh(fleet, f"cat /proc/{main}/cgroup")
    # The node's PID and the container's, beside the main process's (1 in its namespace).
    assert proc_status(fleet, main, "NSpid") == [str(main), "1"]
    assert proc_status(fleet, execd, "NSpid")[0] == str(execd)
    assert len(proc_status(fleet, execd, "NSpid")) == 2
    sh(fleet, f"kill -KILL {execd}")
    time.sleep(0.3)
    assert sh(fleet, "pgrep -f '^exec-sleeper' || true") == ""
    assert sh(fleet, "docker inspect -f '{{.State.Pid}} {{.State.Status}} {{.RestartCount}}' "
                     "dev") == f"{main} running 0"
    # What the real CLI says when the command or the container is not there.
    missing = fleet.run_in("node01", ["docker", "exec", "dev", "nosuch-tool"])
    assert (missing.returncode, missing.stdout.rstrip()) == (127, (
        "OCI runtime exec failed: exec failed: unable to start container process: exec: "
        '"nosuch-tool": executable file not found in $PATH: unknown'))
    nosuch = fleet.run_in("node01", ["docker", "exec", "nosuch", "true"])
    assert (nosuch.returncode, nosuch.stderr.strip()) == (
        1, "Error response from daemon: No such container: nosuch")
    # A process exec'd into a container dies with it.
    sh(fleet, "docker exec -d dev bash -c 'exec -a exec-sleeper sleep 300'")
    assert wait_for(lambda: sh(fleet, "pgrep -f '^exec-sleeper' || true") != "")
    cid = sh(fleet, "docker inspect -f '{{.Id}}' dev")
    sh(fleet, "docker stop -t 1 dev")
    assert sh(fleet, "pgrep -f '^exec-sleeper' || true") == ""
    stopped = fleet.run_in("node01", ["docker", "exec", "dev", "true"])
    assert (stopped.returncode, stopped.stderr.strip()) == (
        1, f"Error response from daemon: Container {cid} is not running")


def test_a_shell_docker_exec_ran_loops_its_gpu_job_as_on_a_real_node(fleet: SimFleet) -> None:
    # `docker exec -d CTR sh -c 'while :; do python3 -m sglang.launch_server ...; sleep 1;
    # done'` (RELIABILITY item 62): the shell is the shim's child and leads a session of its
    # own (runc's setsid); the server's worker holds the GPU and nvidia-smi lists it by its
    # node PID. Killed, the server is run again by the shell; the shell killed, what it ran
    # is adopted by the container's init, its main process (the kernel reparents within the
    # PID namespace; the shim, a subreaper outside it, is skipped), still in its session.
    (main,) = fleet.spawn("node01", "container", container="loop", run="holder", gpus="",
                          name="sleep infinity")
    try:
        shim = int(proc_status(fleet, main, "PPid")[0])
        env = (f"-e PYTHONPATH={launcher.FAKEPKGS} -e FLEETCLEAN_SIM_PROGRAMS={launcher.PROGRAMS}"
               " -e FLEETCLEAN_SIM_GPUS=7 -e FLEETCLEAN_SIM_GPU_MIB=1024")
        sh(fleet, f"docker exec -d {env} loop sh -c "
                  "'while :; do python3 -m sglang.launch_server --tp 1; sleep 1; done'")
        assert wait_for(lambda: len(holders(fleet, 7)) == 1)
        (worker,) = holders(fleet, 7)
        server = int(proc_status(fleet, worker, "PPid")[0])
        shell = int(proc_status(fleet, server, "PPid")[0])
        assert int(proc_status(fleet, shell, "PPid")[0]) == shim
        rows = sh(fleet, f"ps -o sid=,args= -p {shell},{server},{worker}").splitlines()
        assert [row.strip() for row in rows] == [
            f"{shell} sh -c while :; do python3 -m sglang.launch_server --tp 1; sleep 1; done",
            f"{shell} python3 -m sglang.launch_server --tp 1",
            f"{shell} sglang::scheduler_TP0"]
        assert f"{worker}, sglang::scheduler_TP0, 1024 MiB" in sh(
            fleet, "nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                   "--format=csv,noheader").splitlines()
        sh(fleet, f"kill -TERM {server}")
        assert wait_for(lambda: len(holders(fleet, 7) - {worker}) == 1, timeout=15)
        (again,) = holders(fleet, 7)
        server = int(proc_status(fleet, again, "PPid")[0])
        assert int(proc_status(fleet, server, "PPid")[0]) == shell
        sh(fleet, f"kill -KILL {shell}")
        assert wait_for(lambda: int(proc_status(fleet, server, "PPid")[0]) == main)
        assert sh(fleet, f"ps -o sid= -p {server}") == str(shell)
        assert holders(fleet, 7) == {again}
    finally:
        sh(fleet, "docker stop -t 0 loop")
    assert holders(fleet, 7) == set()


def test_a_rootless_container_runs_under_its_users_own_daemon_as_the_real_one(
    fleet: SimFleet,
) -> None:
    # Rootless Docker: alice's daemon is her manager's docker.service, run as her (in a
    # user namespace of her own, as RootlessKit makes it), listening in her runtime dir;
    # its containers' processes are hers. The CLI picks the daemon as the real one does:
    # -H/--host, else DOCKER_HOST, else root's, which knows none of her containers.
    refusal = user_namespace_refusal()
    if refusal:
        pytest.skip(refusal)
    uid = accounts.user("alice").uid
    sock = f"/run/user/{uid}/docker.sock"
    (first,) = fleet.spawn("node02", "container", container="mine", rootless="alice",
                           restart="always", gpus="5")
    fleet.spawn("node02", "container", container="theirs", gpus="6")  # root's daemon runs too
    daemon = sh(fleet, f"systemctl --user -M {uid}@ show -p MainPID --value docker", "node02")
    assert sh(fleet, f"ps -o user=,args= -p {daemon}", "node02").split() == ["alice", "dockerd"]
    assert sh(fleet, f"stat -c '%U %a' {sock} $(dirname {sock})", "node02").splitlines() == [
        "alice 755", "alice 700"]
    assert sh(fleet, f"ps -o user= -p {first}", "node02") == "alice"
    inspect = "inspect -f '{{.State.Pid}} {{.RestartCount}} {{.State.Status}}' mine"
    for how in (f"docker -H unix://{sock}", f"docker --host=unix://{sock}",
                f"DOCKER_HOST=unix://{sock} docker"):
        assert sh(fleet, f"{how} {inspect}", "node02") == f"{first} 0 running"
    if fleet.cgroup_mode == "v2":  # its own scope, under her manager's delegated subtree
        assert sh(fleet, f"grep ^0:: /proc/{first}/cgroup", "node02").startswith(
            f"0::/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/docker-")
    info = f"docker -H unix://{sock} info -f '{{{{.CgroupDriver}}}} {{{{.SecurityOptions}}}}'"
    driver = "systemd" if fleet.cgroup_mode == "v2" else "none"
    assert sh(fleet, info, "node02") == (
        f"{driver} [name=seccomp,profile=builtin name=rootless name=cgroupns]")
    # Root's daemon, the CLI's default, knows nothing of it.
    for argv in (["docker", "stop", "mine"], ["docker", "-H", "unix://", "stop", "mine"]):
        done = fleet.run_in("node02", argv)
        assert (done.returncode, done.stderr.strip()) == (
            1, "Error response from daemon: No such container: mine")
    assert "mine" not in sh(fleet, "docker ps -a --format '{{.Names}}'", "node02").split()
    for argv, env, words in (
        (["docker", "-H", "unix:///a.sock", "-H", "unix:///b.sock", "ps"], "",
         "Please specify only one -H"),
        (["docker", "ps"], "DOCKER_HOST=unix:///run/user/9/docker.sock",
         "Cannot connect to the Docker daemon at unix:///run/user/9/docker.sock. Is the "
         "docker daemon running?"),
    ):
        done = fleet.run_in("node02", ["env", *env.split(), *argv])
        assert (done.returncode, done.stderr.strip()) == (1, words)
    # Its restart policy is its own daemon's: killed, it comes back; stopped, it stays down.
    sh(fleet, f"kill -KILL {first}", "node02")
    assert wait_for(lambda: len(holders(fleet, 5, "node02") - {first}) == 1)
    (again,) = holders(fleet, 5, "node02")
    assert sh(fleet, f"DOCKER_HOST=unix://{sock} docker {inspect}", "node02") == (
        f"{again} 1 running")
    assert sh(fleet, f"docker -H unix://{sock} stop -t 1 mine", "node02") == "mine"
    assert holders(fleet, 5, "node02") == set()
    # One daemon per user, started once.
    fleet.spawn("node02", "container", container="mine-too", rootless="alice", gpus="5")
    assert sh(fleet, f"systemctl --user -M {uid}@ show -p MainPID --value docker",
              "node02") == daemon
    sh(fleet, f"docker -H unix://{sock} stop -t 0 mine-too; docker stop -t 0 theirs", "node02")


def test_pod_container_killed_is_replaced_by_the_kubelet(fleet: SimFleet) -> None:
    (first,) = fleet.spawn("node01", "pod", pod="llm-0", namespace="ml", gpus="5")
    before = sh(fleet, "crictl ps -q")
    sh(fleet, f"kill -KILL {first}")
    assert wait_for(lambda: len(holders(fleet, 5) - {first}) == 1)
    template = '{{index .status.labels "io.kubernetes.pod.namespace"}}/' \
               '{{index .status.labels "io.kubernetes.pod.name"}} {{.status.metadata.attempt}}'
    after = sh(fleet, "crictl ps -q")
    assert after != before
    assert sh(fleet, f"crictl inspect -o go-template --template '{template}' {after}") == \
        "ml/llm-0 1"


@NEEDS_CGROUPS
def test_processes_read_node_relative_cgroups(fleet: SimFleet) -> None:
    (main,) = fleet.spawn("node02", "service", unit="vllm", gpus="0")
    inside = sh(fleet, f"cat /proc/{main}/cgroup", node="node02").splitlines()
    assert any(line.endswith(":/system.slice/vllm.service") for line in inside)
    assert not any("fleetclean-sim-" in line for line in inside)
    host_pid = next(p.host_pid for p in fleet.processes("node02") if p.pid == main)
    outside = Path(f"/proc/{host_pid}/cgroup").read_text()
    assert "/fleetclean-sim-" in outside and "/node02/system.slice/vllm.service" in outside
    init = sh(fleet, "cat /proc/1/cgroup", node="node02").splitlines()
    assert any(line.endswith(":/init.scope") for line in init)
    ssh = subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), "node02",
                          "cat /proc/self/cgroup"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert any(line.endswith(":/system.slice/ssh.service") for line in ssh.stdout.splitlines())


@NEEDS_CGROUPS
def test_sim_down_removes_every_cgroup_and_process(tmp_path: Path) -> None:
    fleet = SimFleet.up(1, tmp_path / "f", subnet=module_subnet())
    try:
        fleet.spawn("node01", "container", container="c", restart="always", gpus="0")
        fleet.spawn("node01", "service", unit="u", gpus="1")
        prefixes = sim_cgroups.load(fleet.state_dir).prefixes
        assert prefixes and all(os.path.isdir(p) for p in prefixes)
    finally:
        down_checked(fleet)
    assert [p for p in prefixes if os.path.exists(p)] == []


@NEEDS_CGROUPS
def test_sim_up_failing_half_way_removes_its_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    real_create = sim_cgroups.create

    def create(state_dir: Path, fleet_plan: sim_cgroups.Plan, nodes: dict[str, Path]) -> None:
        made.extend(fleet_plan.prefixes)
        real_create(state_dir, fleet_plan, nodes)

    def broken(*_: object, **__: object) -> None:
        raise SimError("sshd would not start (injected)")

    monkeypatch.setattr(sim_cgroups, "create", create)
    monkeypatch.setattr(sim_node, "wait_listener", broken)
    with pytest.raises(SimError, match="injected"):
        up_claimed(module_subnet(), 1, tmp_path / "f")
    assert made and [p for p in made if os.path.exists(p)] == []


def test_a_fleet_without_cgroups_still_runs_supervisors(tmp_path: Path) -> None:
    fleet = SimFleet.up(1, tmp_path / "f", subnet=module_subnet(), cgroup="none")
    try:
        assert fleet.cgroup_mode == "none"
        (main,) = fleet.spawn("node01", "service", unit="plainly", gpus="6")
        sh(fleet, f"kill -KILL {main}")
        assert wait_for(lambda: len(holders(fleet, 6) - {main}) == 1)
        sh(fleet, "systemctl stop plainly")
        assert holders(fleet, 6) == set()
    finally:
        down_checked(fleet)


def test_sim_spawn_starts_a_supervised_workload_from_the_command_line(fleet: SimFleet) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetclean", "sim", "spawn", "node02",
                           "service", "--unit", "by-hand", "--gpus", "7", "--state-dir",
                           str(fleet.state_dir)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    (pid,) = [int(w) for w in done.stdout.split("pids", 1)[1].split()]
    assert holders(fleet, 7, node="node02") == {pid}
    assert show_on(fleet, "node02", "by-hand") == str(pid)


def show_on(fleet: SimFleet, node: str, unit: str) -> str:
    return sh(fleet, f"systemctl show -p MainPID --value {unit}", node=node)


def test_sim_status_says_the_cgroup_mode(fleet: SimFleet) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetclean", "sim", "status", "--state-dir",
                           str(fleet.state_dir)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert f"cgroups: {fleet.cgroup_mode}" in done.stdout
