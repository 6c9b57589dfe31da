"""A login's key goes with its request for the authentication service, not a round trip
after it (transport/upstream.py: _KeyWithService): the messages a client sends, in order,
read from a stand-in for paramiko's transport; the signature checked with the key."""

from __future__ import annotations

import socket
import threading
from typing import Any

import paramiko
import pytest

from fleetclean.transport import upstream
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


def test_an_agents_key_signs_as_paramiko_has_it_sign_within_the_logins_limit() -> None:
    # An agent may wait on a person (a touch, a confirmation) or never answer: its signing
    # stays in paramiko's handler of the service's answer, which auth_timeout bounds.
    wire = Wire(server_sig_algs=True)
    agent_key = paramiko.AgentKey(None, paramiko.ECDSAKey.generate().asbytes())
    handler = _login(wire, agent_key)
    assert _kinds(wire) == [SERVICE_REQUEST]
    assert not handler.sent


class _Server(paramiko.ServerInterface):
    def __init__(self, accepted: paramiko.PKey) -> None:
        self.accepted = accepted

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return (paramiko.AUTH_SUCCESSFUL if key.asbytes() == self.accepted.asbytes()
                else paramiko.AUTH_FAILED)


def test_fleetcleans_transport_logs_in_with_it_and_counts_a_refused_key() -> None:
    """Over a socket pair to paramiko's own server: the login goes through _KeyWithService
    (its key sent early), a refused key is counted (connect.py words the failure by it)."""
    accepted, stranger = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    near, far = socket.socketpair()
    server = paramiko.Transport(far)
    server.add_server_key(paramiko.ECDSAKey.generate())
    server.start_server(threading.Event(), server=_Server(accepted))  # in its own thread
    client = upstream.transport(near)
    try:
        client.start_client(timeout=10)
        with pytest.raises(paramiko.AuthenticationException):
            client.auth_publickey("root", stranger)
        assert client.refused == 1  # type: ignore[attr-defined]
        client.auth_publickey("root", accepted)
        assert client.is_authenticated()
        handler = client.auth_handler
        assert isinstance(handler, _KeyWithService) and handler.sent
    finally:
        client.close()
        server.close()
