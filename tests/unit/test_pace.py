"""Pacing new connections: slots per sshd, halved after a drop, shared by every host behind
one ProxyCommand."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fleetclean.inventory import load_inventory
from fleetclean.transport import connect, session
from fleetclean.transport.base import Options
from fleetclean.transport.hops import Configs, resolve
from fleetclean.transport.pace import Startups


def test_a_slot_waits_while_its_sshd_has_limit_connections_starting() -> None:
    gate = Startups(limit=2)
    entered: list[int] = []
    release = threading.Event()

    def start(n: int) -> None:
        with gate.slot("bastion"):
            entered.append(n)
            release.wait(5)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(entered) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(entered) == 2, "a third connection started past the limit"
    with gate.slot("another sshd"):
        pass  # other sshds are not held up
    release.set()
    for t in threads:
        t.join(5)
    assert sorted(entered) == [0, 1, 2]


def test_each_drop_halves_the_limit_down_to_one() -> None:
    gate = Startups(limit=8)
    for want in (4, 2, 1, 1):
        gate.dropped("bastion")
        assert gate.limit("bastion") == want
    assert gate.limit("other") == 8


def test_hosts_behind_one_proxycommand_share_one_gate_and_get_their_own_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ssh_config").write_text(
        "Host gpu*\n    ProxyCommand ssh -W %h:%p ops@bastion\n"
        "Host solo\n    ProxyCommand ssh -W %h:%p other-bastion\n")
    (tmp_path / "hosts.ini").write_text("gpu01\ngpu02 ansible_port=2222\nsolo\n")
    hosts = load_inventory([str(tmp_path / "hosts.ini")],
                           ssh_config=str(tmp_path / "ssh_config")).select(None)
    keys: dict[str, Any] = {}
    routes = {h.name: resolve(session.target_of(h), h.proxy_jump, Configs().get(h.ssh_config))
              for h in hosts}
    # %p is the port fleetclean connects to (the inventory's), as ssh's -p would make it
    assert routes["gpu02"].proxy_command == "ssh -W gpu02:2222 ops@bastion"

    def record(target: Any, ctx: Any, make_sock: Any, pace: Any = None) -> None:
        keys[target.name] = pace

    monkeypatch.setattr(session, "open_connection", record)
    with session.Session(Options()) as s:
        for host in hosts:
            s.connect(host)
    assert keys["gpu01"] == keys["gpu02"] == ("proxycommand", "ssh -W %h:%p ops@bastion")
    assert keys["solo"] == ("proxycommand", "ssh -W %h:%p other-bastion")
    assert connect.MAX_ATTEMPTS > 1
