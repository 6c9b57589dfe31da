"""A GPU job that a shell ``docker exec`` started runs in a loop, over SSH (RELIABILITY item
62): ``docker exec -d CTR sh -c 'while :; do python3 -m sglang.launch_server ...; sleep 1;
done'``, or a server run from the bash of ``docker exec -it CTR bash``. Item 59 killed the
job by its PID and watched the shell, which started it again: the host ended dirty
(``respawn``). Under ``owner_docker: stop`` the job is stopped with its exec session (the
shell first, so that it cannot start the job again), the container and the rest of it
left running; under ``refuse`` the exec session is named with what to kill; under
``signal`` a job whose exec session went with it is not watched in its container.

One one-node fleet for the module; each test uses a container and GPUs of its own and
leaves the node idle: the containers are stopped through docker, which takes every process
exec'd into them too.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest
from simhelp import Cli, sh
from slurmhelp import wait_for

from fleetclean.sim import SimFleet, uvm_count
from fleetclean.sim import cgroups as sim_cgroups
from fleetclean.sim.launcher import FAKEPKGS, PROGRAMS

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(sim_cgroups.plan("probe").mode == "none",
                       reason=f"no writable cgroup hierarchy: {sim_cgroups.plan('probe').why}"),
]
LOOP = "while :; do python3 -m sglang.launch_server --tp 2; sleep 1; done"
# A CUDA process of GPU {gpu} (the fake's GPUs are their minors here: sim up's default).
HOLD = ("import time; f = open('/dev/nvidia{gpu}'); u = open('/dev/nvidia-uvm'); "
        f"{uvm_count.OPENED_PY}; time.sleep(3600)")


@pytest.fixture
def fleet(shared: SimFleet) -> Iterator[SimFleet]:
    yield shared
    # Through docker: a container stopped takes what was exec'd into it.
    sh(shared, "docker ps -q | xargs -r docker stop -t 0 >/dev/null")
    assert wait_for(lambda: shared.gpu_used_mib("node01") == [0] * 8)


def running(fleet: SimFleet, pids: list[int]) -> list[int]:
    """The PIDs of ``pids`` that run in the node (not zombies), as its own ps sees them."""
    out = sh(fleet, "ps -eo pid=,stat= | awk '$2 !~ /^Z/ {print $1}'").split()
    return [p for p in pids if str(p) in out]


def pids_of(fleet: SimFleet, pattern: str) -> list[int]:
    """The live processes of the node whose command line matches ERE ``pattern``."""
    out = sh(fleet, f"pgrep -f '{pattern}' || true")
    return sorted(int(p) for p in out.split() if running(fleet, [int(p)]))


def dev_container(fleet: SimFleet, name: str) -> tuple[int, str]:
    """A dev container whose main process sleeps (no GPU): its main PID and id."""
    (main,) = fleet.spawn("node01", "container", container=name, restart="always",
                          run="holder", gpus="", name="sleep infinity")
    return main, sh(fleet, f"docker inspect -f '{{{{.Id}}}}' {name}")


def exec_gpu_job(fleet: SimFleet, ctr: str, gpus: str, command: str) -> None:
    """``docker exec -d`` into ``ctr`` the shell ``command``, which runs the fake SGLang
    server (as an SGLang image has it installed) on ``gpus``, or another GPU job, 2048 MiB
    a GPU; returns once nvidia-smi shows the GPUs used."""
    env = (f"-e PYTHONPATH={FAKEPKGS} -e FLEETCLEAN_SIM_PROGRAMS={PROGRAMS} "
           f"-e FLEETCLEAN_SIM_GPUS={gpus} -e FLEETCLEAN_SIM_GPU_MIB=2048")
    sh(fleet, f"docker exec -d {env} {ctr} {command}")
    want = [int(g) for g in gpus.split(",")]
    assert wait_for(lambda: all(fleet.gpu_used_mib("node01")[g] == 2048 for g in want))


def run(cli: Cli, fleet: SimFleet, *extra: str) -> tuple[int, dict[str, Any]]:
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json", *extra)
    return done.code, done.host("node01")


def test_a_looped_exec_job_is_stopped_with_its_shell_and_the_container_left_running(
    fleet: SimFleet, cli: Cli
) -> None:
    # A dev container; in it, a user's other exec session (a shell that idles), a
    # protected process (nv-hostengine) and an SGLang server that an exec'd shell runs in
    # a loop. Item 59 killed the server by PID; its shell started it again 1 s later.
    main, cid = dev_container(fleet, "t-loop")
    sh(fleet, "docker exec -d t-loop bash -c 'exec -a t-other-session sleep 600'")
    sh(fleet, "docker exec -d t-loop bash -c 'exec -a nv-hostengine sleep 600'")
    exec_gpu_job(fleet, "t-loop", "2,3", f"sh -c '{LOOP}'")
    (shell,) = pids_of(fleet, "^sh -c while")
    (server,) = pids_of(fleet, "^python3 -m sglang.launch_server")
    workers = pids_of(fleet, "^sglang::")
    (other,) = pids_of(fleet, "^t-other-session")
    (guard,) = pids_of(fleet, "^nv-hostengine")
    checked = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    # The loop is matched as the server it runs (its identity: each command it runs).
    assert (f"would send TERM to {shell} (sh -c {LOOP}), owner docker {cid[:12]} (started "
            f"by docker exec, not its main process {main}) [code: sh -c :; python3 -m "
            "sglang.launch_server; sleep]") in checked.out, checked.out
    assert "would stop docker" not in checked.out
    code, host = run(cli, fleet)
    assert (code, host["status"], host["verify"]["rule"]) == (0, "clean", "clean"), host
    assert running(fleet, [main, shell, server, *workers, other, guard]) == [main, other, guard]
    # The shell went first: nothing was left to start the server again.
    assert host["signalled"][0]["pid"] == shell
    assert {s["pid"] for s in host["signalled"]} == {shell, server, *workers}
    assert {s["owner"]["id"] for s in host["signalled"]} == {cid}
    assert host["warnings"] == [] and host["left_running"] == []
    # Read again once the loop's `sleep 1` would have run it: nothing came back.
    time.sleep(3)
    assert pids_of(fleet, "sglang") == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert sh(fleet, "docker inspect -f '{{.State.Pid}} {{.State.Status}} {{.RestartCount}}' "
                     "t-loop") == f"{main} running 0"


def test_an_interactive_shells_looped_job_is_stopped_without_waiting_out_the_grace(
    fleet: SimFleet, cli: Cli
) -> None:
    # The bash of `docker exec -it CTR bash`, in which the user runs the server in a loop:
    # an interactive bash ignores SIGTERM. It gets SIGKILL at once (it would outlive the
    # server's 10 s grace and run the server anew meanwhile), the server TERM.
    main, _ = dev_container(fleet, "t-tty")
    exec_gpu_job(fleet, "t-tty", "4,5", f"bash -ic '{LOOP}'")
    (shell,) = pids_of(fleet, "^bash -ic while")
    (server,) = pids_of(fleet, "^python3 -m sglang.launch_server")
    ignored = int(sh(fleet, f"awk '/^SigIgn/ {{print $2}}' /proc/{shell}/status"), 16)
    assert ignored & (1 << 14), "an interactive bash ignores SIGTERM (15)"
    code, host = run(cli, fleet)
    assert (code, host["status"], host["verify"]["rule"]) == (0, "clean", "clean"), host
    sent = [(s["pid"], s["signal"]) for s in host["signalled"]]
    assert sent[:2] == [(shell, "KILL"), (server, "TERM")], sent
    (stop,) = [s for s in host["stages"] if s["name"] == "stop-server"]
    assert stop["duration_s"] < 5, stop
    assert running(fleet, [main, shell, server]) == [main]
    time.sleep(3)
    assert pids_of(fleet, "sglang") == [] and fleet.gpu_used_mib("node01") == [0] * 8


def test_refuse_names_the_exec_session_not_docker_stop(fleet: SimFleet, cli: Cli) -> None:
    # owner_docker=refuse: the job is left running, and what to do is to end its exec
    # session (the shell first), not `docker stop`, which takes the whole container.
    main, cid = dev_container(fleet, "t-ref")
    exec_gpu_job(fleet, "t-ref", "6", f"sh -c '{LOOP.replace('--tp 2', '--tp 1')}'")
    (shell,) = pids_of(fleet, "^sh -c while")
    (server,) = pids_of(fleet, "^python3 -m sglang.launch_server")
    code, host = run(cli, fleet, "-e", "owner_docker=refuse", "-e", "verify_timeout=3")
    assert (code, host["status"], host["verify"]["rule"]) == (1, "dirty", "refused"), host
    assert host["signalled"] == []
    assert running(fleet, [main, shell, server]) == [main, shell, server]
    fixes = {r["fix"] for r in host["refused"]}
    whos = {r["who"] for r in host["refused"]}
    (fix,) = fixes
    (who,) = whos
    assert who == f"docker exec session {shell} (sh) in docker container {cid[:12]}"
    assert fix.startswith(f"kill {shell} {server} "), fix
    assert "docker stop" not in host["error"]


def test_signal_does_not_watch_the_container_of_an_exec_session_it_ended(
    fleet: SimFleet, cli: Cli
) -> None:
    # owner_docker=signal, a job `docker exec` started with no shell around it (its exec
    # session's root is the job itself), in a container where something else starts new
    # processes all the time (a health check, a watcher): docker never starts an exec'd
    # job again, yet its container was watched (its shim "left running"), the host waited
    # out a settle, and any new process there read as a respawn while it was watched.
    main, _ = dev_container(fleet, "t-sig")
    sh(fleet, "docker exec -d t-sig sh -c 'while :; do sleep 0.2; done'")
    exec_gpu_job(fleet, "t-sig", "7", f"python3 -c \"{HOLD.format(gpu=7)}\" t-sig-job")
    (job,) = pids_of(fleet, "t-sig-job")
    code, host = run(cli, fleet, "-e", "owner_docker=signal", "-e", "verify_timeout=3")
    assert (code, host["status"], host["verify"]["rule"]) == (0, "clean", "clean"), host
    assert running(fleet, [main, job]) == [main]
    assert [s["signal"] for s in host["signalled"]] == ["TERM"]
    assert host["left_running"] == [] and host["warnings"] == []


def test_a_cpu_only_sibling_in_the_exec_session_is_left_running(
    fleet: SimFleet, cli: Cli
) -> None:
    # The exec'd shell also started a CPU-only process (a jupyter kernel, an editor,
    # `tensorboard &`) beside the looped server: the shell and the server (and its tree)
    # are stopped, the shell first; the kernel, which uses no GPU and starts nothing
    # again, is left running in the container.
    main, cid = dev_container(fleet, "t-sib")
    kernel_loop = ("python3 -c \"import time; time.sleep(600)\" t-sib-kernel & "
                   + LOOP.replace("--tp 2", "--tp 1"))
    exec_gpu_job(fleet, "t-sib", "0", f"sh -c '{kernel_loop}'")
    (shell,) = pids_of(fleet, "^sh -c python3")
    (server,) = pids_of(fleet, "^python3 -m sglang.launch_server")
    workers = pids_of(fleet, "^sglang::")
    (kernel,) = pids_of(fleet, "^python3 -c import time.*t-sib-kernel")
    code, host = run(cli, fleet)
    assert (code, host["status"], host["verify"]["rule"]) == (0, "clean", "clean"), host
    assert host["signalled"][0]["pid"] == shell
    assert {s["pid"] for s in host["signalled"]} == {shell, server, *workers}
    assert {s["owner"]["id"] for s in host["signalled"]} == {cid}
    time.sleep(3)
    assert running(fleet, [main, shell, server, *workers, kernel]) == [main, kernel]
    assert pids_of(fleet, "sglang") == [] and fleet.gpu_used_mib("node01") == [0] * 8
    assert sh(fleet, "docker inspect -f '{{.State.Pid}} {{.State.Status}}' t-sib") == (
        f"{main} running")


def test_a_job_stuck_after_its_exec_sessions_end_does_not_stop_the_container(
    fleet: SimFleet, cli: Cli
) -> None:
    # The looped server waits in the node's stuck driver: stop-server kills its shell and
    # then it (SIGKILL after the grace), and it stays in state D, adopted by the
    # container's main process. kill-gpu-holders sees it again: it read as the main
    # process's job, and the container was docker-stopped (another user's exec session
    # in it with it). It is still the exec'd job it was: the container is left running.
    main, _ = dev_container(fleet, "t-stk")
    sh(fleet, "docker exec -d t-stk bash -c 'exec -a t-stk-other sleep 600'")
    here = PROGRAMS.rsplit("/", 1)[0]
    sh(fleet, f"python3 -c 'import sys; sys.path.insert(0, \"{here}\"); import launcher; "
              "launcher.ensure_stuckfs()'")
    spec = json.dumps({"role": "holder", "gpus": [1], "ctl": True, "driver_wait": "hang",
                       "title": "python3 -m sglang.launch_server --tp 1"}).ljust(120)
    loop = f"while :; do python3 {PROGRAMS} {shlex.quote(spec)}; sleep 1; done"
    try:
        exec_gpu_job(fleet, "t-stk", "1", f"sh -c {shlex.quote(loop)}")
        (shell,) = pids_of(fleet, "^sh -c while")
        (job,) = pids_of(fleet, "^python3 -m sglang.launch_server")
        (other,) = pids_of(fleet, "^t-stk-other")
        code, host = run(cli, fleet, "-e", "grace=0.5", "-e", "verify_timeout=5")
        assert (code, host["status"]) == (1, "dirty"), host
        assert host["stuck"] == [{"pid": job, "cmdline":
                                  "python3 -m sglang.launch_server --tp 1"}], host
        # Killed, in state D, adopted by the container's main process.
        ppid, stat = sh(fleet, f"ps -o ppid=,stat= -p {job}").split()
        assert (int(ppid), stat[0]) == (main, "D")
        # Never `docker stop` (a "stop" record): only the stages' signals.
        assert {s["signal"] for s in host["signalled"]} <= {"TERM", "KILL"}, host["signalled"]
        assert "stopped docker" not in str(host), host
        assert running(fleet, [main, shell, other]) == [main, other]
        assert sh(fleet, "docker inspect -f '{{.State.Pid}} {{.State.Status}}' t-stk") == (
            f"{main} running")
    finally:
        fleet.set_fault("node01", "unstick")
