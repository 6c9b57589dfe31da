"""Slow and stalling SSH servers, for real, on loopback: each phase's time limit is its own.

A server that stalls is a ``timeout`` naming the phase it stalled in, within
--connect-timeout; a server that is slow but correct still ends ``clean``; neither is ever
``auth_failed``. The stalling servers are tiny listeners this test starts; the slow one is a
real sim node's sshd behind a proxy that delays every byte the server sends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from simhelp import Cli

from fleetclean.sim import SimFleet

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
