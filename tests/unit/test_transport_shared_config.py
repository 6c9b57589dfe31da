"""Connections built at once from threads share one fabric Config and must leave it alone:
fabric writes an undeclared attribute into it, which re-merges it from scratch while the
other threads read it (``transport/connect.py``, ``_Connection``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import invoke.config
import pytest

from fleetclean.transport.connect import Context, _connection
from fleetclean.transport.hops import Target
from fleetclean.transport.hostkeys import KnownHostsCache


def _target(n: int) -> Target:
    return Target(f"gpu{n:02d}", f"127.0.9.{n}", 22, "root", None)


@pytest.fixture
def eager_switching() -> Iterator[None]:
    # Threads switch every microsecond, so that a read landing inside another thread's
    # re-merge is likely instead of rare.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_building_a_connection_does_not_re_merge_the_shared_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = Context(5.0, KnownHostsCache(()), accept_new=False)
    merges: list[object] = []
    real = invoke.config.Config.merge

    def counted(self: invoke.config.Config) -> None:
        merges.append(self)
        real(self)

    monkeypatch.setattr(invoke.config.Config, "merge", counted)
    _connection(_target(1), None, ctx, 5.0)
    assert [m for m in merges if m is ctx.fabric_config] == []


def test_connections_built_from_many_threads_at_once_all_succeed(eager_switching: None) -> None:
    ctx = Context(5.0, KnownHostsCache(()), accept_new=False)
    errors: list[BaseException] = []

    def build(n: int) -> None:
        try:
            for _ in range(25):
                _connection(_target(n), None, ctx, 5.0)
        except BaseException as exc:  # the failure under test, kept for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(n,)) for n in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_key_exchange_gets_the_whole_connect_timeout() -> None:
    # paramiko's own handshake_timeout (15 s) cut a longer --connect-timeout short there,
    # and the slow key exchange read as a closed connection instead of a timeout.
    import socket

    ctx = Context(40.0, KnownHostsCache(()), accept_new=False)
    conn = _connection(_target(1), None, ctx, 40.0)
    ours, theirs = socket.socketpair()
    try:
        made = conn.connect_kwargs["transport_factory"](ours, disabled_algorithms=None)
        assert made.handshake_timeout == 40.0
        made.close()
    finally:
        ours.close()
        theirs.close()
