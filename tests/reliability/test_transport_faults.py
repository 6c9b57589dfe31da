"""Transport fault classification without a fleet: the races a silent listener causes."""

from __future__ import annotations

import logging

import paramiko

from fleetclean.models import Host
from fleetclean.transport import classify

HOST = Host(name="gpu01", address="10.0.0.1")


def test_lost_banner_race_after_the_timeout_is_a_timeout() -> None:
    # paramiko's handshake timer may fire before its banner timer: "No existing session"
    for text in ("No existing session", "Negotiation failed."):
        failure = classify(paramiko.SSHException(text), HOST, 3.0, 3.0)
        assert failure is not None and failure.kind == "timeout"
        assert failure.message == "10.0.0.1:22 accepted TCP but sent no SSH banner within 3s"


def test_early_dropped_banner_is_retried() -> None:
    assert classify(paramiko.SSHException("Error reading SSH protocol banner"), HOST, 0.1, 3) \
        is None


def test_paramiko_reader_thread_errors_never_reach_stderr() -> None:
    assert any(isinstance(h, logging.NullHandler)
               for h in logging.getLogger("paramiko").handlers)
