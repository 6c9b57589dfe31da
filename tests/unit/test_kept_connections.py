"""The connections ``status --watch`` keeps between refreshes (``transport/session.py``)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from fleetclean.models import Host
from fleetclean.transport import Options
from fleetclean.transport.session import Session
from fleetclean.transport.sshlib import paramiko


class Silent:
    """A kept connection whose peer vanished without a word (a firewall or NAT forgot it):
    paramiko still says it is connected, and no session channel ever opens on it."""

    def __init__(self) -> None:
        self.is_connected = True
        self.closed = False
        transport = mock.Mock()
        transport.open_session.side_effect = paramiko.SSHException("Timeout opening channel.")
        self.client = mock.Mock(get_transport=lambda: transport)

    def close(self) -> None:
        self.closed = True


def test_a_kept_connection_that_died_silently_is_replaced_at_the_next_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It was kept, dead, at every refresh: the host read "timeout" until TCP gave up.
    monkeypatch.setattr("fleetclean.transport.session.running", lambda conn: None)
    monkeypatch.setattr("fleetclean.transport.session.idle", lambda conn: None)
    session = Session(Options(connect_timeout=0.2, timeout=1), keep=True)
    host = Host(name="gpu01", address="gpu01")
    dead, fresh = Silent(), Silent()
    session._kept["gpu01"] = dead
    made: list[Any] = []

    def connect(h: Host) -> Any:
        made.append(h.name)
        return fresh

    monkeypatch.setattr(session, "connect", connect)
    session.run(host, ("echo hi\n",))
    assert made == ["gpu01"] and dead.closed
    assert session._kept.get("gpu01") is not dead
