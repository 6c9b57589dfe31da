"""A login's key goes with its request for the authentication service, not a round trip
after it (transport/upstream.py: _KeyWithService): the messages a client sends, in order,
read from a stand-in for paramiko's transport; the signature checked with the key."""

from __future__ import annotations

import threading
from typing import Any

import paramiko

from fleetclean.transport.upstream import _KeyWithService

SERVICE_REQUEST, USERAUTH_REQUEST = 5, 50


class Wire:
    """What _KeyWithService needs of a transport, and what it sent."""

    def __init__(self, server_sig_algs: bool) -> None:
        self.lock = threading.Lock()
        self.session_id = b"\x01" * 32
        self.server_mode = False
        self.preferred_pubkeys = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
        self.server_extensions = {"server-sig-algs": b"rsa-sha2-256,ssh-ed25519"} if (
            server_sig_algs) else {}
        self.sent: list[paramiko.Message] = []

    def _send_message(self, m: paramiko.Message) -> None:
        self.sent.append(paramiko.Message(m.asbytes()))

    def _log(self, *args: Any) -> None:
        pass


def _kinds(wire: Wire) -> list[int]:
    kinds = []
    for m in wire.sent:
        m.rewind()
        kinds.append(m.get_byte()[0])
    return kinds


def _accept() -> paramiko.Message:
    m = paramiko.Message()
    m.add_string("ssh-userauth")
    m.rewind()
    return m


def _login(wire: Wire, key: paramiko.PKey) -> _KeyWithService:
    handler = _KeyWithService(wire)  # type: ignore[arg-type]  # a stand-in
    handler.auth_publickey("root", key, threading.Event())
    return handler


def test_the_signed_key_follows_the_service_request_at_once() -> None:
    # A key whose algorithm is its type (ECDSA, as Ed25519: paramiko generates no Ed25519
    # key), sent before the server has named any algorithm.
    wire = Wire(server_sig_algs=False)
    key = paramiko.ECDSAKey.generate()
    handler = _login(wire, key)
    assert _kinds(wire) == [SERVICE_REQUEST, USERAUTH_REQUEST]
    auth = wire.sent[1]
    assert [auth.get_text(), auth.get_text(), auth.get_text(), auth.get_boolean()] == [
        "root", "ssh-connection", "publickey", True]
    algorithm, blob, sig = auth.get_text(), auth.get_binary(), auth.get_binary()
    assert algorithm == key.get_name() and blob == key.asbytes()
    signed = handler._get_session_blob(key, "ssh-connection", "root", algorithm)  # type: ignore[attr-defined]
    assert key.verify_ssh_sig(signed, paramiko.Message(sig))
    # The service's answer, when it comes, sends nothing more.
    handler._parse_service_accept(_accept())
    assert len(wire.sent) == 2


def test_an_rsa_key_waits_for_the_servers_algorithms() -> None:
    key = paramiko.RSAKey.generate(1024)
    early = Wire(server_sig_algs=False)
    handler = _login(early, key)
    assert _kinds(early) == [SERVICE_REQUEST]  # paramiko's way: after the service's answer
    early.server_extensions = {"server-sig-algs": b"rsa-sha2-256"}
    handler._parse_service_accept(_accept())
    assert _kinds(early) == [SERVICE_REQUEST, USERAUTH_REQUEST]
    # Once the server has named them: at once, in rsa-sha2-256, which it named.
    said = Wire(server_sig_algs=True)
    _login(said, key)
    assert _kinds(said) == [SERVICE_REQUEST, USERAUTH_REQUEST]
    auth = said.sent[1]
    assert [auth.get_text(), auth.get_text(), auth.get_text(), auth.get_boolean(),
            auth.get_text()] == ["root", "ssh-connection", "publickey", True, "rsa-sha2-256"]
