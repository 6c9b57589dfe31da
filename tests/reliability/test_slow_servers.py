"""Slow and stalling SSH servers, for real, on loopback: each phase's time limit is its own.

A server that stalls is a ``timeout`` naming the phase it stalled in, within
--connect-timeout; a server that is slow but correct still ends ``clean``; neither is ever
``auth_failed``. The stalling servers are tiny listeners this test starts; the slow one is a
real sim node's sshd behind a proxy that delays every byte the server sends.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from simhelp import Cli

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import Renderer
from fleetclean.engine.variables import resolve
from fleetclean.fleet import Job, run_fleet
from fleetclean.models import Host
from fleetclean.results.live import LiveProgress
from fleetclean.sim import SimFleet
from fleetclean.transport import Options

CONNECT_TIMEOUT = 2


class Listener:
    """Accepts TCP on 127.0.0.1, optionally sends an SSH banner, then never answers."""

    def __init__(self, banner: bytes | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.banner = banner
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.clients.append(client)
            if self.banner:
                with contextlib.suppress(OSError):
                    client.sendall(self.banner)

    def close(self) -> None:
        for s in [*self.clients, self.sock]:
            s.close()


@pytest.fixture
def listener() -> Iterator[Callable[[bytes | None], Listener]]:
    made: list[Listener] = []

    def make(banner: bytes | None) -> Listener:
        made.append(Listener(banner))
        return made[-1]

    yield make
    for item in made:
        item.close()


def _inventory(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"stall": {
        "ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root"}}}}))
    return path


@pytest.mark.parametrize(("banner", "words"), [
    (None, "accepted TCP but sent no SSH banner within 2s"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "key exchange did not finish within 2s"),
])
def test_a_stalling_server_is_a_timeout_naming_the_phase(
    listener: Callable[[bytes | None], Listener], cli: Cli, tmp_path: Path,
    banner: bytes | None, words: str,
) -> None:
    server = listener(banner)
    res = cli("status", "-i", _inventory(tmp_path, server.port), "-F", "",
              "--connect-timeout", str(CONNECT_TIMEOUT), "--json")
    assert res.code == 2, res.err
    host = res.host("stall")
    assert host["status"] == "timeout"
    assert host["error"] == f"127.0.0.1:{server.port}{' ' if banner is None else ': '}{words}"
    # within --connect-timeout, not paramiko's 15 s defaults (generous bound: shared CPU)
    assert res.seconds < CONNECT_TIMEOUT + 8


def test_a_host_in_its_key_exchange_holds_two_threads_its_worker_and_its_transport(
    listener: Callable[[bytes | None], Listener], cli: Cli, tmp_path: Path,
) -> None:
    """Issue #18 bounds a run's threads by --forks: paramiko started a third thread per
    connection (a ``threading.Timer`` for its handshake's limit), 64 more at 64 forks."""
    servers = [listener(b"SSH-2.0-OpenSSH_9.6\r\n") for _ in range(6)]
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {f"stall{i}": {
        "ansible_host": "127.0.0.1", "ansible_port": s.port, "ansible_user": "root"}
        for i, s in enumerate(servers)}}}))
    before = threading.active_count()
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            threads = threading.enumerate()
            seen.append((len(threads), sum(isinstance(t, threading.Timer) for t in threads)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        res = cli("status", "-i", path, "-F", "", "--forks", "6",
                  "--connect-timeout", str(CONNECT_TIMEOUT), "--json")
    finally:
        done.set()
        sampler.join()
    assert [h["status"] for h in res.json()["hosts"]] == ["timeout"] * 6, res.err
    assert max(timers for _, timers in seen) == 0
    # the six hosts' workers and transports, and the sampler (no live view under --json);
    # one more for a thread a library may start
    assert max(n for n, _ in seen) - before <= 2 * 6 + 2, seen


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that holds every chunk the server sends for ``delay`` s."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.delay = target, delay
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for src, dst, delay in ((client, upstream, 0.0), (upstream, client, self.delay)):
                threading.Thread(target=self._pump, args=(src, dst, delay), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                time.sleep(delay)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for s in [*self.socks, self.listener]:
            s.close()


@pytest.mark.sim
def test_a_slow_but_correct_sshd_still_ends_clean(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    fleet.spawn("node01", "sglang", gpus="0-1")
    proxy = DelayProxy((fleet.node("node01").address, 22), delay=1.0)
    try:
        data = yaml.safe_load(fleet.inventory_path.read_text())
        data["all"]["hosts"]["node01"].update(ansible_host="127.0.0.1", ansible_port=proxy.port)
        inv = tmp_path / "inv.yml"
        inv.write_text(yaml.safe_dump(data))
        known = tmp_path / "known_hosts"
        key = (fleet.node("node01").dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        known.write_text(f"[127.0.0.1]:{proxy.port} {' '.join(key)}\n")
        res = cli("run", "post-extraction", "-i", inv, "--known-hosts", known, "-e", "grace=1",
                  "--connect-timeout", "4", "--json")
    finally:
        proxy.close()
    assert "Traceback" not in res.err
    statuses = {h["host"]: (h["status"], h["error"]) for h in res.json()["hosts"]}
    assert statuses == {"node01": ("clean", None), "node02": ("clean", None)}
    assert fleet.gpu_used_mib("node01") == [0] * 8


@pytest.mark.sim
def test_a_fleet_far_away_is_torn_down_and_read_as_a_near_one(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    """A node across a VPN from the laptop (every byte 0.2 s late each way: a round trip of
    0.4 s, which no phase waits out within --connect-timeout 2) is neither a timeout nor
    auth_failed: its teardown ends clean and its GPUs read 0 MiB, as the near node's."""
    fleet = sim_fleet_factory(2)
    fleet.set_fault("node01", "latency", 0.4)
    for node in fleet.nodes:
        fleet.spawn(node.name, "sglang", gpus="0-1")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=1",
              "--connect-timeout", "2", "--json")
    assert "Traceback" not in res.err
    hosts = {h["host"]: h for h in res.json()["hosts"]}
    for name in ("node01", "node02"):
        assert (hosts[name]["status"], hosts[name]["error"]) == ("clean", None), hosts[name]
        assert fleet.gpu_used_mib(name) == [0] * 8
    # It was far: its run took round trips the near one did not (at least a login's four).
    assert hosts["node01"]["duration_s"] > hosts["node02"]["duration_s"] + 4 * 0.4


@pytest.mark.sim
def test_stalled_and_slow_sshds_among_fast_ones_each_get_their_own_outcome(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    """The simulator's own slow servers in one run: a banner then silence is a timeout
    naming the key exchange within --connect-timeout, an authentication slower than it is a
    timeout (never auth_failed), a slow but correct one and the fast ones end clean."""
    fleet = sim_fleet_factory(4)
    fleet.set_fault("node01", "stall")
    fleet.set_fault("node02", "slow-auth", 1)
    fleet.set_fault("node03", "slow-auth", 60)
    for node in fleet.nodes:
        fleet.spawn(node.name, "sglang", gpus="0-1")
    limit = 3
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=1",
              "--connect-timeout", str(limit), "--json")
    assert "Traceback" not in res.err
    hosts = {h["host"]: h for h in res.json()["hosts"]}
    address = {n.name: n.address for n in fleet.nodes}
    assert hosts["node01"]["status"] == "timeout"
    assert hosts["node01"]["error"] == (
        f"{address['node01']}:22: key exchange did not finish within {limit}s")
    assert hosts["node03"]["status"] == "timeout"
    assert hosts["node03"]["error"] == (
        f"{address['node03']}:22: authentication did not finish within {limit}s")
    for name in ("node02", "node04"):
        assert (hosts[name]["status"], hosts[name]["error"]) == ("clean", None), hosts[name]
        assert fleet.gpu_used_mib(name) == [0] * 8
    # within --connect-timeout per phase, not paramiko's defaults (generous: shared CPU)
    assert hosts["node01"]["duration_s"] < limit + 8
    assert res.json()["summary"] == {"hosts": 4, "clean": 2, "dirty": 0, "faulty": 0,
                                     "failed": 2}


@pytest.mark.sim
def test_the_live_view_says_how_far_each_slow_host_got_while_it_connects(
    sim_fleet_factory: Callable[..., SimFleet]
) -> None:
    """While it waits, a server silent after its banner shows as in the key exchange and
    one slow to authenticate as authenticating; the fast ones are done meanwhile."""
    fleet = sim_fleet_factory(3)
    fleet.set_fault("node01", "stall")
    fleet.set_fault("node02", "slow-auth", 60)
    book = resolve(load_playbook("status"), {}, {})
    renderer = Renderer()
    jobs = [Job(Host(n.name, n.address, port=22, user="root", key=str(fleet.client_key_path)),
                renderer.pieces(book, host_name=n.name)) for n in fleet.nodes]
    opts = Options(connect_timeout=4, known_hosts=(str(fleet.known_hosts_path),))
    live = LiveProgress(Console(file=io.StringIO()), [n.name for n in fleet.nodes])
    seen: dict[str, set[str]] = {"node01": set(), "node02": set()}
    run = threading.Thread(target=run_fleet, args=(jobs,),
                           kwargs={"playbook": "status", "opts": opts, "on_event": live})
    run.start()
    while run.is_alive():
        screen = Console(width=100, record=True, file=io.StringIO())
        screen.print(live.render())  # what a terminal shows: one line per host, 3 hosts
        for line in screen.export_text().splitlines():
            host, _, doing = line.partition(" ")
            if host in seen:
                seen[host].add(doing.strip())
        time.sleep(0.05)
    run.join()
    assert "connecting (key exchange)" in seen["node01"], seen
    assert "connecting (authentication)" in seen["node02"], seen
    assert live.counts() == {"done": 3}
