"""Dead is dead, stuck is said, half-stopped is named (issue #12 items 3 and 5), over SSH
on a simulated node, and the process-table functions of ``lib.sh`` on the node's own
processes: a zombie (``<defunct>``), a process that vanished, one in its exit.

The stuck and slow-to-exit workers wait in the node's own "driver" (a FUSE file system
the simulator serves, ``sim/stuckfs.py``): the kernel's waits are real. One fleet serves
the module; each test leaves its node idle.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from simhelp import Cli, alive

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
STAGES = Path(__file__).resolve().parents[2] / "fleetclean" / "engine" / "stages"




def state(fleet: SimFleet, pid: int) -> str:
    stat = fleet.node_path("node01", f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rindex(b")") + 2 :].split()[0].decode()


def stage(host: dict[str, object], name: str) -> dict[str, object]:
    stages = host["stages"]
    assert isinstance(stages, list)
    return next(s for s in stages if s["name"] == name)


def lib(fleet: SimFleet, script: str) -> str:
    """What ``script`` prints, run by bash inside the node with the libraries loaded."""
    done = fleet.run_in("node01", ["bash", "-c", f". {STAGES}/lib.sh; . {STAGES}/lib-stage.sh; "
                                   f". {STAGES}/lib-kill.sh; {script}"])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_defunct_killed_worker_leaves_the_host_clean(fleet: SimFleet, cli: Cli) -> None:
    parent, worker0, worker1 = fleet.spawn("node01", "zombie-parent", gpus="0,1", mib=4096)
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=1",
               "--json")
    host = done.host("node01")
    assert (done.code, host["status"], host["error"]) == (0, "clean", None)
    assert {state(fleet, worker0), state(fleet, worker1)} == {"Z"}  # its parent never reaps
    assert stage(host, "kill-gpu-holders")["remaining"] == 0
    # The launcher lives on: a person must know it is still there.
    assert host["left_running"] == [
        {"pid": parent, "cmdline": "python3 /opt/train/launch.py --nproc 2"}]


def test_a_killed_worker_slow_in_its_exit_is_gone_not_a_survivor(
    fleet: SimFleet, cli: Cli
) -> None:
    # Ignores SIGTERM; after SIGKILL its exit takes 6 s, past the stage's 3 s kill_wait.
    (worker,) = fleet.spawn("node01", "slow-exit", gpu=4, delay=6)
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert (done.code, host["status"], host["error"]) == (0, "clean", None)
    holders = stage(host, "kill-gpu-holders")
    assert (holders["status"], holders["remaining"]) == ("ok", 0)
    assert {(s["pid"], s["signal"]) for s in host["signalled"]} == {
        (worker, "TERM"), (worker, "KILL")}


def test_a_process_stuck_in_the_kernel_is_said_so_not_a_failed_stage(
    fleet: SimFleet, cli: Cli
) -> None:
    (stuck,) = fleet.spawn("node01", "stuck", gpu=2, mib=8192)
    fleet.spawn("node01", "sglang", gpus="0-1")
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=0.5",
               "-e", "verify_timeout=120", "--json")
    host = done.host("node01")
    assert (done.code, host["status"]) == (1, "dirty")
    assert host["verify"] == {"rule": "stuck"}  # nothing left to wait for: not the deadline
    assert (f"held by {stuck} python3 stuck_worker.py --gpu 2 (root; GPU2; stuck in the "
            "kernel (state D) since SIGKILL: reboot or reset needed)") in host["error"]
    holders = stage(host, "kill-gpu-holders")
    assert (holders["status"], holders["remaining"]) == ("ok", 1)
    assert host["stuck"] == [{"pid": stuck, "cmdline": "python3 stuck_worker.py --gpu 2"}]
    assert state(fleet, stuck) == "D" and [g["memory_used_mib"] for g in host["gpus"]] == [
        0, 0, 8192, 0, 0, 0, 0, 0]
    fleet.set_fault("node01", "unstick")  # the driver lets go: SIGKILL takes it at last
    deadline = time.monotonic() + 10
    while alive(fleet, "node01", [stuck]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(fleet, "node01", [stuck]) == []


def test_a_killed_worker_whose_thread_is_stuck_in_the_driver_is_said_so_at_once(
    fleet: SimFleet, cli: Cli
) -> None:
    # Its driver request waits in a second thread: SIGKILL leaves its main thread a zombie
    # (no command line, no /proc/PID/fd) and that thread in state D, the GPU still held and
    # the PID still listed by nvidia-smi. It was taken for gone and then for the GPU's live
    # holder, and the run waited out its whole verify_timeout.
    (worker,) = fleet.spawn("node01", "stuck-thread", gpu=3, mib=8192)
    started = time.monotonic()
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=0.5",
               "-e", "verify_timeout=120", "--json")
    assert time.monotonic() - started < 60  # not the deadline
    host = done.host("node01")
    assert (done.code, host["status"], host["verify"]) == (1, "dirty", {"rule": "stuck"})
    assert state(fleet, worker) == "Z"
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0, 0, 0, 8192, 0, 0, 0, 0]
    assert host["stuck"] == [{"pid": worker, "cmdline": "python3 stuck_worker.py --gpu 3"}]
    assert (f"held by {worker} python3 stuck_worker.py --gpu 3 (root; GPU3; stuck in the "
            "kernel (state D) since SIGKILL: reboot or reset needed)") in host["error"]
    fleet.set_fault("node01", "unstick")  # the driver lets go: the last thread ends
    deadline = time.monotonic() + 10
    while fleet.gpu_used_mib("node01")[3] and time.monotonic() < deadline:
        time.sleep(0.05)
    again = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert (again["status"], [g["memory_used_mib"] for g in again["gpus"]]) == (
        "clean", [0] * 8)


def test_a_killed_worker_whose_thread_leaves_the_driver_late_is_waited_for_not_stuck(
    fleet: SimFleet, cli: Cli
) -> None:
    # The same worker, but the driver answers 1.5 s after the kill: a slow teardown, which
    # ends with the GPU free, not a stuck one (its memory flat for longer than leak_quiet).
    (worker,) = fleet.spawn("node01", "stuck-thread", gpu=3, mib=8192)

    def let_go() -> None:
        deadline = time.monotonic() + 60
        while state(fleet, worker) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.5)
        fleet.set_fault("node01", "unstick")

    helper = threading.Thread(target=let_go)
    helper.start()
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=0.5",
               "-e", "verify_timeout=60", "--json")
    helper.join()
    host = done.host("node01")
    assert (done.code, host["status"], host["error"]) == (0, "clean", None), host
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0] * 8 and host["stuck"] == []


def test_lib_tells_a_zombie_whose_thread_waits_in_the_kernel_from_a_dead_one(
    fleet: SimFleet,
) -> None:
    _, dead, _ = fleet.spawn("node01", "zombie-parent", gpus="0,1")
    (stuck,) = fleet.spawn("node01", "stuck-thread", gpu=2)
    fleet.run_in("node01", ["kill", "-KILL", str(dead), str(stuck)])
    deadline = time.monotonic() + 10
    while {state(fleet, dead), state(fleet, stuck)} != {"Z"} and time.monotonic() < deadline:
        time.sleep(0.05)
    out = lib(fleet, "fc_scan; "
                     f"for p in {dead} {stuck}; do "
                     'fc_exit_waits "$p" "${FC_START[$p]}" && echo "$p waits" || echo "$p gone"; '
                     "done")
    assert out.split("\n")[:2] == [f"{dead} gone", f"{stuck} waits"]
    # The simulated nvidia-smi, as the real one, lists the PID with the memory it holds.
    apps = fleet.run_in("node01", ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader"]).stdout
    listed = dict(line.split(", ") for line in apps.splitlines())
    assert listed[str(stuck)] == "20480 MiB" and str(dead) not in listed


def test_the_vllm_api_server_left_running_is_named(fleet: SimFleet, cli: Cli) -> None:
    server, engine, worker0, worker1 = fleet.spawn("node01", "vllm", gpus="0-1", mib=30000)
    # post-extraction knows SGLang only: vLLM's workers go as GPU holders, their parents
    # stay, and that is said.
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert host["status"] == "clean" and alive(fleet, "node01", [worker0, worker1]) == []
    assert host["left_running"] == [
        {"pid": server, "cmdline": "python3 -m vllm.entrypoints.openai.api_server --model "
         "/models/Llama-3.1-70B-Instruct --tensor-parallel-size 2 --port 8000"},
        {"pid": engine, "cmdline": "VLLM::EngineCore"}]
    assert alive(fleet, "node01", [server, engine]) == [server, engine]
    quiet = cli("run", "pre-restart", "-i", fleet.inventory_path)
    assert "left running" not in quiet.out  # nothing killed this time: nothing to say
    fleet.run_in("node01", ["kill", "-KILL", str(server), str(engine)])
    fleet.spawn("node01", "vllm", gpus="2-3")
    table = cli("run", "pre-restart", "-i", fleet.inventory_path)
    assert "node01: left running: " in table.out, table.out
    assert "python3 -m vllm.entrypoints.openai.api_server" in table.out
    assert "(parent of killed GPU holders)" in table.out


# --- lib.sh on the node's own processes ------------------------------------------------


def test_lib_takes_a_zombie_for_gone(fleet: SimFleet) -> None:
    parent, worker, _ = fleet.spawn("node01", "zombie-parent", gpus="0,1")
    fleet.run_in("node01", ["kill", "-KILL", str(worker)])
    deadline = time.monotonic() + 10
    while state(fleet, worker) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    out = lib(fleet, f"fc_scan; fc_keep_unprotected {worker} {parent}; "
                     f"echo targets=${{FC_TARGETS[*]}}; "
                     f"fc_alive {worker} ${{FC_START[{worker}]}} x && echo alive || echo gone")
    assert out.split() == [f"targets={parent}", "gone"]


def test_lib_escalation_on_a_process_that_vanished_signals_nothing(fleet: SimFleet) -> None:
    (holder,) = fleet.spawn("node01", "stubborn", gpu=6)
    # Scanned, then gone before the signal: the escalation reports it gone, sends nothing.
    out = lib(fleet, f"fc_scan; kill -KILL {holder}; "
                     f"while [[ -e /proc/{holder} ]]; do sleep 0.01; done; FC_IDX=1; "
                     f"fc_escalate TERM 100 100 {holder}; "
                     "echo signalled=$FC_SIGNALLED remaining=$FC_REMAINING")
    assert out.split()[-2:] == ["signalled=0", "remaining=0"]


def test_lib_takes_a_process_in_its_exit_for_gone(fleet: SimFleet) -> None:
    (worker,) = fleet.spawn("node01", "slow-exit", gpu=5, delay=4)
    out = lib(fleet, f"fc_scan; start=${{FC_START[{worker}]}} cmd=${{FC_CMD[{worker}]}}; "
                     f"kill -KILL {worker}; "
                     f"until [[ -z $(tr -d '\\0' </proc/{worker}/cmdline) ]]; do "
                     "sleep 0.01; done; "
                     f"read -r _ _ st _ </proc/{worker}/stat; echo state=$st; "
                     f'fc_alive {worker} "$start" "$cmd" && echo alive || echo gone; '
                     f'fc_alive {worker} "$start" && echo alive-by-stat || echo gone-by-stat')
    # Still a process (not yet a zombie) whose command line is gone: gone to a stage. Its
    # state is D while its exit waits in the stuck driver, R for the moments around that.
    state, *rest = out.split()
    assert state in ("state=D", "state=R") and rest == ["gone", "alive-by-stat"], out
