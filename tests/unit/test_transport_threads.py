"""Connections built in many threads at once share one fabric.Config: building one must
never disturb another (fabric 3.2 wrote each connection's inline_ssh_env into it)."""

from __future__ import annotations

import sys
import threading

from fleetclean.transport.connect import Context, _connection
from fleetclean.transport.hops import Target
from fleetclean.transport.hostkeys import KnownHostsCache


def test_connections_built_at_once_in_many_threads_all_build() -> None:
    ctx = Context(5.0, KnownHostsCache(()), accept_new=False)
    errors: list[str] = []

    def build(n: int) -> None:
        for i in range(40):
            target = Target(f"gpu{n}-{i}", f"10.0.{n}.{i + 1}", 22, "root", None)
            try:
                conn = _connection(target, None, ctx, 5.0)
                _ = (conn.forward_agent, conn.authentication)  # read from the shared config
            except Exception as exc:  # the race raised AttributeError
                errors.append(f"{type(exc).__name__}: {str(exc)[:80]}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as a loaded machine does
    try:
        threads = [threading.Thread(target=build, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
