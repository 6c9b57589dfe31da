"""Connections that outlive one run: ``status --watch`` keeps them, and the library API
runs on fabric ``Connection``s its caller made (and leaves them as it found them)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest
from fabric import Connection, Group
from simhelp import Cli, spawn_cli, stop_cli, wait_for

from fleetclean import api, cgroupfs
from fleetclean.commands import memory
from fleetclean.models import HostStatus
from fleetclean.sim import SimFleet, cgroups

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> SimFleet:
    fleet: SimFleet = module_fleet_factory(3)
    return fleet


def count(fleet: SimFleet, name: str, needle: str) -> int:
    return (fleet.node(name).dir / "sshd.log").read_text(errors="replace").count(needle)


def counts(fleet: SimFleet, needle: str) -> dict[str, int]:
    return {n.name: count(fleet, n.name, needle) for n in fleet.nodes}


def drop_connections(fleet: SimFleet, name: str) -> None:
    """Kill the sshd processes serving logged-in connections on ``name`` (by PID, inside
    the node); its listener stays."""
    for proc in fleet.processes(name, include_system=True):
        if proc.cmdline.startswith("sshd: root"):
            os.kill(proc.host_pid, signal.SIGTERM)


def test_status_watch_logs_in_once_per_host_and_again_only_where_dropped(
    fleet: SimFleet, tmp_path: Path
) -> None:
    logins, sessions = counts(fleet, "Accepted publickey"), counts(fleet, "Starting session")

    def refreshed(times: int, name: str | None = None) -> bool:
        now = counts(fleet, "Starting session")
        return all(now[n] - sessions[n] >= times for n in ([name] if name else now))

    proc = spawn_cli(tmp_path, "status", "--watch", "0.2", "-i", str(fleet.inventory_path))
    try:
        wait_for("three refreshes", lambda: refreshed(3))
        drop_connections(fleet, "node02")
        at_drop = count(fleet, "node02", "Starting session")
        wait_for("two more refreshes of node02",
                 lambda: count(fleet, "node02", "Starting session") >= at_drop + 2)
    finally:
        _, err = stop_cli(proc)
    assert proc.returncode == 130, err
    after = counts(fleet, "Accepted publickey")
    assert {n: after[n] - logins[n] for n in after} == {"node01": 1, "node02": 2, "node03": 1}


def limited_cli(tmp_path: Path, files: int | None, *argv: str,
                cgroup: Path | None = None) -> subprocess.Popen[str]:
    """fleetclean in a child of this test whose soft and hard limits on open files are
    ``files`` (None: as they are); in ``cgroup`` (which the child joins itself) if given."""
    limit = "" if files is None else (
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({files}, {files})); ")
    code = (f"import resource, runpy, sys; {limit}"
            "sys.argv[0] = 'fleetclean'; runpy.run_module('fleetclean', run_name='__main__')")
    env = dict(os.environ, FLEETCLEAN_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    command = [sys.executable, "-c", code, *argv]
    if cgroup is not None:
        command = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh",
                   *command]
    return subprocess.Popen(command, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _can_join(cgroup: Path) -> bool:
    """Whether a process of this test may be moved into ``cgroup`` (a sleep it starts,
    moved, then killed by its PID)."""
    probe = subprocess.Popen(["sleep", "30"])
    try:
        (cgroup / "cgroup.procs").write_text(f"{probe.pid}\n")
        return True
    except OSError:
        return False
    finally:
        probe.kill()  # our own child, by PID
        probe.wait()


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    """A cgroup of the pids controller, below this test's own, for the child that joins
    it; removed after (the simulator's prefix: ``sim down`` knows it as ours)."""
    mountinfo, own = Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup")
    mine = cgroupfs.own_cgroups(own.read_text())
    made: Path | None = None
    for h in cgroupfs.mounted_hierarchies(mountinfo):
        where = cgroupfs.in_mount(h, mine.get(h.key, "/"))
        if where is None or not (h.v2 or "pids" in h.key.split(",")):
            continue
        path = Path(where) / f"{cgroups.PREFIX}test-{os.getpid()}"
        try:
            path.mkdir()
        except OSError:
            continue
        if (path / "pids.max").exists() and _can_join(path):
            made = path
            break
        path.rmdir()
    if made is None:
        pytest.skip("no writable cgroup with the pids controller on this machine")
    try:
        yield made
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                made.rmdir()  # empty once the child has exited
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_forks_beyond_the_open_files_limit_are_scaled_down_and_said(
    fleet: SimFleet, tmp_path: Path
) -> None:
    # 64 files for the process's own, 4 for each host in flight: two of the three at once.
    proc = limited_cli(tmp_path, 72, "status", "-f", "64", "--json", "-i",
                       str(fleet.inventory_path))
    out, err = proc.communicate(timeout=120)
    assert "leaves room for 2 hosts at once: running 2 at a time, not --forks 64" in err, err
    assert proc.returncode == 0, err
    assert {h["status"] for h in json.loads(out)["hosts"]} == {"clean"}


def watch_under_limits(fleet: SimFleet, proc_of: Callable[[], subprocess.Popen[str]],
                       ) -> tuple[str, list[int]]:
    """Start the watch ``proc_of`` makes, let every host refresh three times, stop it with
    Ctrl-C: its stderr and each host's new logins, fewest first."""
    logins, sessions = counts(fleet, "Accepted publickey"), counts(fleet, "Starting session")
    proc = proc_of()
    try:
        wait_for("three refreshes of every host", lambda: all(
            n - sessions[h] >= 3 for h, n in counts(fleet, "Starting session").items()))
        # The watch started itself again (same PID) without glibc's per-thread caches.
        if memory.wanted(os.environ):
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            assert memory.TUNABLE.encode() in b":".join(
                v.partition(b"=")[2] for v in environ if v.startswith(b"GLIBC_TUNABLES="))
    finally:
        out, err = stop_cli(proc)
    assert proc.returncode == 130, err
    assert "Too many open files" not in out + err and "new thread" not in out + err
    after = counts(fleet, "Accepted publickey")
    return err, sorted(after[n] - logins[n] for n in after)


def test_status_watch_keeps_no_more_connections_than_its_open_files_limit_allows(
    fleet: SimFleet, tmp_path: Path
) -> None:
    """Under a hard limit of 78 files (64 for the process's own, 4 for each of the 3
    hosts in flight at once, and 2 left), two hosts' connections are kept and the third
    logs in at every refresh: said once, and every host still refreshed, none failing for
    want of a file."""
    err, new = watch_under_limits(fleet, lambda: limited_cli(
        tmp_path, 78, "status", "--watch", "0.2", "-f", "4", "-i", str(fleet.inventory_path)))
    assert "status --watch keeps 2 of 3 hosts' connections" in err, err
    assert "open-files limit (ulimit -n)" in err, err
    assert new[:2] == [1, 1] and new[2] >= 3, new


def test_status_watch_keeps_no_more_connections_than_its_cgroups_pids_limit_allows(
    fleet: SimFleet, tmp_path: Path, pids_cgroup: Path
) -> None:
    """In a cgroup whose pids.max leaves room for the watch's own threads, one host in
    flight, and one more (limits.THREAD_SPARE, THREADS_PER_HOST): one host's connection
    is kept or none (the process's own threads when it looks: one or two), the others log
    in at every refresh; said, with the file that sets it, and no thread refused."""
    (pids_cgroup / "pids.max").write_text(f"{1 + 16 + 3 + 1}\n")
    err, new = watch_under_limits(fleet, lambda: limited_cli(
        tmp_path, None, "status", "--watch", "0.2", "-f", "1", "-i",
        str(fleet.inventory_path), cgroup=pids_cgroup))
    kept = [k for k in (0, 1) if f"status --watch keeps {k} of 3 hosts' connections" in err]
    assert kept and f"{pids_cgroup.name}/pids.max" in err, err
    assert new[:kept[0]] == [1] * kept[0] and min(new[kept[0]:]) >= 3, new


def _connections(fleet: SimFleet) -> list[Connection]:
    key = {"key_filename": str(fleet.client_key_path)}
    return [Connection(n.address, user="root", connect_kwargs=dict(key)) for n in fleet.nodes]


def ssh_objects() -> int:
    """paramiko transports, packetizers and channels alive in this process."""
    kinds = (paramiko.Transport, paramiko.Packetizer, paramiko.Channel)
    return sum(isinstance(o, kinds) for o in gc.get_objects())


def test_a_finished_hosts_connection_is_freed_at_once_not_by_the_garbage_collector(
    fleet: SimFleet, cli: Cli
) -> None:
    """Issue #18: paramiko's transport is in reference cycles (its own bound methods, the
    exception that ended its thread, the handshake timer paramiko's own packetizer starts),
    so every finished host's transport, packetizer and channel stayed until a full
    collection, which a run of hundreds of hosts met about once: 25 KB a host of the
    controller's peak RSS."""
    gc.collect()
    before = ssh_objects()
    gc.disable()  # what reference counting alone frees
    try:
        res = cli("status", "-i", fleet.inventory_path, "--json")
        assert res.code == 0, res.err
        wait_for("the transports' threads to end", lambda: not any(
            isinstance(t, paramiko.Transport) for t in threading.enumerate()), 10)
        left = ssh_objects() - before
    finally:
        gc.enable()
    assert left == 0, f"{left} transports, packetizers or channels of finished hosts"


def test_the_library_cleans_hosts_given_as_fabric_connections(fleet: SimFleet) -> None:
    pids = fleet.spawn("node01", "sglang", gpus="0-3")
    conns = _connections(fleet)
    conns[2].open()  # the caller's own, open before: it stays open

    result = api.run("post-extraction", conns, variables={"grace": 1},
                     known_hosts=[str(fleet.known_hosts_path)])

    assert [(h.host, h.status) for h in result.hosts] == [
        (n.address, HostStatus.CLEAN) for n in fleet.nodes]
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert {s.pid for s in result.hosts[0].signalled} >= set(pids[1:])
    assert result.exit_status == 0
    assert api.to_json(result)["summary"]["clean"] == 3
    assert [c.is_connected for c in conns] == [False, False, True]
    conns[2].close()


API_UNDER_LIMIT = r"""
import json, resource, sys, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (72, 72))
from fabric import Connection
from fleetclean import api
key, known, *addresses = sys.argv[1:]
conns = [Connection(a, user="root", connect_kwargs={"key_filename": key}) for a in addresses]
lock, now, most = threading.Lock(), [0], [0]
def seen(event):
    with lock:
        now[0] += {"start": 1, "done": -1}.get(event.kind, 0)
        most[0] = max(most[0], now[0])
result = api.status(conns, forks=64, known_hosts=[known], on_event=seen)
print(json.dumps({"most": most[0], "statuses": [h.status.value for h in result.hosts]}))
"""


def test_the_library_runs_no_more_hosts_at_once_than_its_open_files_limit_allows(
    fleet: SimFleet
) -> None:
    # 64 files for the process's own, 4 for each host in flight: two of the three at once.
    out = subprocess.run(
        [sys.executable, "-c", API_UNDER_LIMIT, str(fleet.client_key_path),
         str(fleet.known_hosts_path), *(n.address for n in fleet.nodes)],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["statuses"] == ["clean"] * 3
    assert seen["most"] == 2


def test_the_library_refuses_an_unknown_host_key_of_a_group(
    fleet: SimFleet, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    group = Group(*(n.address for n in fleet.nodes[:2]), user="root",
                  connect_kwargs={"key_filename": str(fleet.client_key_path)})
    before = counts(fleet, "Accepted publickey")

    result = api.status(group, known_hosts=[str(empty)])

    assert [h.status for h in result.hosts] == [HostStatus.HOST_KEY_MISMATCH] * 2
    assert all("unknown host key" in (h.error or "") for h in result.hosts)
    assert counts(fleet, "Accepted publickey") == before, "nothing logged in"
    assert empty.read_text() == ""
    assert result.exit_status == 2
