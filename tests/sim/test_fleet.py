"""The simulated fleet end to end: real sshd, real ssh client, real signals.

Every fleet comes from ``sim_fleet_factory`` (tests/conftest.py), which takes it down by
PID whatever happens here. Host processes a test starts are killed by PID in ``finally``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetclean.sim import SimFleet
from fleetclean.sim import pids as sim_pids

pytestmark = pytest.mark.sim
Factory = Callable[..., SimFleet]
USED = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]


def ssh(
    fleet: SimFleet, node: str, command: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), "-o", "ConnectTimeout=5", node, command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def used_over_ssh(fleet: SimFleet, node: str) -> list[int]:
    done = ssh(fleet, node, " ".join(USED))
    assert done.returncode == 0, done.stderr
    return [int(v) for v in done.stdout.split()]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def node_pids(fleet: SimFleet, node: str) -> set[int]:
    return {p.pid for p in fleet.processes(node)}


def still_running(pid: int, started: int | None) -> bool:
    fields = sim_pids.stat_fields(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def host_canary() -> subprocess.Popen[bytes]:
    """A host process with sglang in its command line: what an escaped pkill would hit."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "sglang.launch_server"]
    )


def test_ssh_reaches_every_node(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(4)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda n: ssh(fleet, n.name, "hostname"), fleet.nodes))
    assert [r.stdout.strip() for r in results] == [n.name for n in fleet.nodes]
    assert all(r.returncode == 0 for r in results)


def test_sixty_four_parallel_sessions_on_one_node(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    with ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(lambda _: ssh(fleet, "node01", "true").returncode, range(64)))
    assert codes == [0] * 64


def test_nvidia_smi_reports_workload_memory_then_zero(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(2)
    server, *workers = fleet.spawn("node01", "sglang", mib=40960)
    assert len(workers) == 9  # eight schedulers and a detokenizer
    assert used_over_ssh(fleet, "node01") == [40960] * 8
    assert used_over_ssh(fleet, "node02") == [0] * 8
    assert ssh(fleet, "node01", f"kill {server} {' '.join(map(str, workers))}").returncode == 0
    assert wait_for(lambda: used_over_ssh(fleet, "node01") == [0] * 8)
    assert wait_for(lambda: node_pids(fleet, "node01") == set())


def test_sglang_tree_looks_like_the_real_one(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    started = fleet.spawn("node01", "sglang", gpus="0-3")
    procs = {p.pid: p for p in fleet.processes("node01")}
    server = procs[started[0]]
    assert server.cmdline.startswith("python3 -m sglang.launch_server --model-path")
    assert "--tp 4" in server.cmdline
    titles = [procs[pid].cmdline for pid in started[1:]]
    assert titles == [f"sglang::scheduler_TP{i}" for i in range(4)] + ["sglang::detokenizer"]
    assert {procs[pid].ppid for pid in started[1:]} == {server.pid}
    assert used_over_ssh(fleet, "node01")[:5] == [62000] * 4 + [0]


def test_pkill_in_one_node_spares_other_nodes_and_the_host(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(2)
    canary = host_canary()
    try:
        fleet.spawn("node01", "sglang")
        on_b = set(fleet.spawn("node02", "sglang")) | set(fleet.spawn("node02", "monitor"))
        ssh(fleet, "node01", "pkill -f sglang")
        assert wait_for(lambda: node_pids(fleet, "node01") == set())
        assert node_pids(fleet, "node02") == on_b
        assert used_over_ssh(fleet, "node02") == [62000] * 8
        assert canary.poll() is None
    finally:
        canary.kill()
        canary.wait()


def test_killing_the_holder_of_gpu3_frees_gpu3_only(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    (holder,) = fleet.spawn("node01", "stubborn", gpu=3, mib=20000)
    fleet.spawn("node01", "stubborn", gpu=5, mib=30000)
    assert used_over_ssh(fleet, "node01") == [0, 0, 0, 20000, 0, 30000, 0, 0]
    ssh(fleet, "node01", f"kill -TERM {holder}")  # ignored: it is stubborn
    assert used_over_ssh(fleet, "node01")[3] == 20000
    ssh(fleet, "node01", f"kill -KILL {holder}")
    assert wait_for(lambda: used_over_ssh(fleet, "node01") == [0, 0, 0, 0, 0, 30000, 0, 0])


def test_fuser_k_reaches_only_its_own_node(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(2)
    canary = host_canary()
    try:
        fleet.spawn("node01", "sglang")
        (monitor,) = fleet.spawn("node01", "monitor")
        (persistenced,) = fleet.spawn("node01", "persistenced")
        on_b = set(fleet.spawn("node02", "sglang"))
        ssh(fleet, "node01", "fuser -k /dev/nvidia* 2>/dev/null; true")
        assert wait_for(lambda: used_over_ssh(fleet, "node01") == [0] * 8)
        left = node_pids(fleet, "node01")
        # fuser -k hits nvidia-persistenced too (the seed's bug), and the monitoring agent,
        # which keeps an NVML handle on every GPU as real ones do.
        assert monitor not in left
        assert persistenced not in left
        assert node_pids(fleet, "node02") == on_b
        assert canary.poll() is None
    finally:
        canary.kill()
        canary.wait()


def test_pkill_python3_in_a_node_kills_the_monitor_but_not_the_node(
    sim_fleet_factory: Factory,
) -> None:
    fleet = sim_fleet_factory(1)
    (monitor,) = fleet.spawn("node01", "monitor")
    assert fleet.processes("node01")[0].cmdline == "python3 /opt/monitor/agent.py"
    ssh(fleet, "node01", "pkill python3; pkill -9 python3; kill -TERM 1; true")
    assert wait_for(lambda: monitor not in node_pids(fleet, "node01"))
    assert ssh(fleet, "node01", "true").returncode == 0


def test_workload_kinds_behave_as_documented(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    (slow,) = fleet.spawn("node01", "slow", gpu=1, delay=0.5)
    (orphan,) = fleet.spawn("node01", "orphan")
    (persistenced,) = fleet.spawn("node01", "persistenced")
    (writer,) = fleet.spawn("node01", "writer", path="/dev/shm/sglang_hs")
    procs = {p.pid: p for p in fleet.processes("node01")}
    assert procs[orphan].cmdline == "sglang::scheduler_TP3"
    assert procs[orphan].ppid == 1
    assert fleet.run_in("node01", ["cat", f"/proc/{persistenced}/comm"]).stdout == (
        "nvidia-persiste\n"
    )
    apps = fleet.run_in(
        "node01", ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
    )
    assert sorted(int(p) for p in apps.stdout.split()) == sorted([slow, orphan])
    holders = fleet.run_in("node01", ["fuser", "/dev/nvidiactl"]).stdout.split()
    assert str(persistenced) in holders
    writers = fleet.run_in("node01", ["fuser", "/dev/shm/sglang_hs/hs_000000.bin"])
    assert writers.stdout.split() == [str(writer)]
    started = time.monotonic()
    fleet.run_in("node01", ["kill", "-TERM", str(slow)])
    assert wait_for(lambda: used_over_ssh(fleet, "node01")[1] == 0)
    assert time.monotonic() - started >= 0.45


def test_a_process_whose_main_thread_exited_lives_on_in_its_thread(
    sim_fleet_factory: Factory,
) -> None:
    # pthread_exit in the main thread: the leader is a zombie with no command line and no
    # /proc/PID/fd, while the process lives in its second thread, holding the GPU.
    fleet = sim_fleet_factory(1)

    def read(path: str) -> str:
        return fleet.run_in("node01", ["cat", path]).stdout

    def thread_of(pid: int) -> tuple[str, list[str], dict[str, str]]:
        """Its one thread besides the leader: the directory, stat's fields from 3 on and
        status."""
        (tid,) = (t for t in fleet.run_in("node01", ["ls", f"/proc/{pid}/task"]).stdout.split()
                  if t != str(pid))
        where = f"/proc/{pid}/task/{tid}"
        status = (line.split(":\t", 1) for line in read(f"{where}/status").splitlines())
        return where, read(f"{where}/stat").rsplit(") ", 1)[1].split(), dict(
            kv for kv in status if len(kv) == 2)

    def running() -> dict[int, str]:
        # (What a run_in leaves in its exit for a moment has no command line; the session
        # a used_over_ssh opened, "sshd: root@notty", may still be closing.)
        return {p.pid: p.cmdline for p in fleet.processes("node01")
                if p.cmdline and not p.cmdline.startswith("sshd")}

    (worker,) = fleet.spawn("node01", "pthread-exit", gpu=5, mib=8192)
    ps = fleet.run_in("node01", ["ps", "-o", "stat=", "-p", str(worker)]).stdout.strip()
    assert ps == "Zl"
    assert read(f"/proc/{worker}/cmdline") == "" and read(f"/proc/{worker}/fd") == ""
    where, stat, status = thread_of(worker)
    assert read(f"{where}/cmdline") == "python3 thread_worker.py --gpu 5\0"
    # Alive: its thread neither in its exit (PF_EXITING, field 9 of stat) nor with SIGKILL
    # pending (status's SigPnd and ShdPnd; stat's field 31 is SigPnd's first 31 bits).
    assert stat[0] == "S" and not int(stat[6]) & 0x4 and int(stat[28]) == 0
    assert int(status["SigPnd"], 16) == int(status["ShdPnd"], 16) == 0
    apps = fleet.run_in("node01", ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader"]).stdout
    assert apps.splitlines() == [f"{worker}, 8192 MiB"]
    assert used_over_ssh(fleet, "node01") == [0, 0, 0, 0, 0, 8192, 0, 0]
    assert running() == {worker: "python3 thread_worker.py --gpu 5"}
    # SIGTERM to the PID reaches the group: the kernel's default ends it, the GPU is free.
    fleet.run_in("node01", ["kill", "-TERM", str(worker)])
    assert wait_for(lambda: used_over_ssh(fleet, "node01") == [0] * 8)
    assert running() == {}
    # Its thread waiting in the stuck driver instead: alive until killed, then the kill
    # waits there (SIGKILL pending in the thread, in state D), as stuck-thread's does.
    (waiting,) = fleet.spawn("node01", "pthread-exit", gpu=2, thread="driver")
    assert set(running()) == {waiting}
    fleet.run_in("node01", ["kill", "-KILL", str(waiting)])
    assert wait_for(lambda: thread_of(waiting)[1][0] == "D")
    _, stat, status = thread_of(waiting)
    assert not int(stat[6]) & 0x4 and int(stat[28]) == 0x100
    assert int(status["SigPnd"], 16) & 0x100 and int(status["ShdPnd"], 16) & 0x100
    assert running() == {} and used_over_ssh(fleet, "node01")[2] == 20480
    fleet.set_fault("node01", "unstick")
    assert wait_for(lambda: used_over_ssh(fleet, "node01") == [0] * 8)


def test_respawned_worker_comes_back(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    supervisor, worker = fleet.spawn("node01", "respawn", gpu=2)
    fleet.run_in("node01", ["kill", "-KILL", str(worker)])

    def replaced() -> bool:
        pids = node_pids(fleet, "node01")
        return worker not in pids and len(pids) == 2

    assert wait_for(replaced, 5)
    assert used_over_ssh(fleet, "node01")[2] > 0
    assert supervisor in node_pids(fleet, "node01")


def test_orphans_are_reaped_not_left_as_zombies(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    started = fleet.spawn("node01", "orphan") + fleet.spawn("node01", "stubborn")
    fleet.run_in("node01", ["kill", "-KILL", *map(str, started)])
    states = "for s in /proc/[0-9]*/stat; do cut -d' ' -f3 $s; done 2>/dev/null"
    assert wait_for(lambda: "Z" not in fleet.run_in("node01", ["sh", "-c", states]).stdout)
    assert node_pids(fleet, "node01") == set()


def test_tmp_and_dev_shm_are_per_node(sim_fleet_factory: Factory, tmp_path: Path) -> None:
    fleet = sim_fleet_factory(2)
    name = f"fleetclean-sim-test-{tmp_path.name}"
    assert ssh(fleet, "node01", f"echo a > /tmp/{name}; echo b > /dev/shm/{name}").returncode == 0
    assert fleet.node_path("node01", f"/tmp/{name}").read_text() == "a\n"
    assert fleet.node_path("node01", f"/dev/shm/{name}").read_text() == "b\n"
    assert not fleet.node_path("node02", f"/tmp/{name}").exists()
    assert not (Path("/tmp") / name).exists()
    assert not (Path("/dev/shm") / name).exists()


def test_faults_change_what_nvidia_smi_does(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    query = "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader"
    fleet.set_fault("node01", "nvml")
    done = ssh(fleet, "node01", query)
    assert (done.returncode, done.stdout) == (
        18,
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n",
    )
    fleet.set_fault("node01", "na")
    assert ssh(fleet, "node01", query).stdout.splitlines()[0] == "0, [N/A]"
    fleet.set_fault("node01", "missing")
    done = ssh(fleet, "node01", query)
    assert done.returncode == 127
    assert "not found" in done.stderr
    fleet.set_fault("node01", "none")
    assert ssh(fleet, "node01", query).stdout.splitlines()[0] == "0, 0 MiB"


def test_stopped_node_refuses_and_restarts(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    (monitor,) = fleet.spawn("node01", "monitor")
    fleet.stop_node("node01")
    done = ssh(fleet, "node01", "true")
    assert done.returncode == 255
    assert "Connection refused" in done.stderr
    assert monitor in node_pids(fleet, "node01")
    fleet.start_node("node01")
    assert ssh(fleet, "node01", "true").returncode == 0


def test_rotated_host_key_is_a_mismatch(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    fleet.rotate_host_key("node01")
    done = ssh(fleet, "node01", "true")
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr
    log = (fleet.node("node01").dir / "sshd.log").read_text()
    assert "session opened" not in log.lower()
    assert "Accepted publickey" not in log


def test_blackholed_node_accepts_but_never_greets(sim_fleet_factory: Factory) -> None:
    fleet = sim_fleet_factory(1)
    fleet.blackhole("node01")
    with socket.create_connection((fleet.node("node01").address, 22), timeout=2) as conn:
        conn.settimeout(0.5)
        with pytest.raises(TimeoutError):
            conn.recv(64)
    fleet.start_node("node01")
    assert ssh(fleet, "node01", "true").returncode == 0


def test_inventory_and_client_files_point_at_the_nodes(sim_fleet_factory: Factory) -> None:
    import yaml

    fleet = sim_fleet_factory(2)
    doc = yaml.safe_load(fleet.inventory_path.read_text())
    node01 = doc["all"]["hosts"]["node01"]
    assert node01["ansible_host"] == fleet.node("node01").address
    assert node01["ansible_port"] == 22
    assert Path(node01["ansible_ssh_private_key_file"]) == fleet.client_key_path
    assert set(doc["all"]["children"]["sim"]["hosts"]) == {"node01", "node02"}
    known = fleet.known_hosts_path.read_text()
    assert f"node01,{fleet.node('node01').address} ssh-ed25519 " in known
    again = SimFleet.load(fleet.state_dir)
    assert again.nodes == fleet.nodes


def test_up_refuses_a_state_dir_in_use(sim_fleet_factory: Factory) -> None:
    from fleetclean.errors import SimError

    fleet = sim_fleet_factory(1)
    with pytest.raises(SimError, match="already up"):
        SimFleet.up(1, fleet.state_dir, subnet=250)


def test_down_after_a_crashed_process_leaves_nothing(tmp_path: Path, sim_subnet: int) -> None:
    state = tmp_path / "crashed"
    script = textwrap.dedent(
        f"""
        import json, os
        from pathlib import Path
        from fleetclean.sim import SimFleet
        fleet = SimFleet.up(2, Path({str(state)!r}), subnet={sim_subnet})
        fleet.spawn("node01", "sglang")
        fleet.spawn("node02", "respawn")
        host = [p.host_pid for n in fleet.nodes for p in fleet.processes(n, include_system=True)]
        print(json.dumps(host), flush=True)
        os._exit(3)  # a test that dies without any teardown
        """
    )
    try:
        crashed = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert crashed.returncode == 3, crashed.stderr
        inside = json.loads(crashed.stdout)
        recorded = sim_pids.load(state / "pids")
        # The nodes' inits, and the zygote that forked them (gone by now).
        roles = sorted(e.role for e in recorded)
        assert roles == ["init:node01", "init:node02", "zygote"] and len(inside) > 15
        starts = {pid: sim_pids.start_time(pid) for pid in inside}
        SimFleet.down_dir(state)
        SimFleet.down_dir(state)  # idempotent
    finally:
        # Whatever failed above, this test's own fleet must not outlive it.
        SimFleet.down_dir(state)
    assert not any(sim_pids.is_alive(e) for e in recorded)
    # A process the kernel killed may stay a zombie for a moment; zombies run nothing.
    assert wait_for(lambda: not [pid for pid, t in starts.items() if still_running(pid, t)])
    assert not state.exists()
