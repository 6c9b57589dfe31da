"""Connection failures classified phase by phase, on paramiko's own exception values.

A phase that runs out of time is ``timeout`` naming the phase; ``auth_failed`` only when the
server refused the credentials (a slow login is not a wrong key: issue #18 saw 14 slow hosts
out of 256 reported as auth_failed).
"""

from __future__ import annotations

import logging

import paramiko
import pytest

from fleetclean.transport.classify import Phase, Where, classify, phase_of
from fleetclean.transport.connect import where
from fleetclean.transport.hops import Target
from fleetclean.transport.hostkeys import UnknownHostKey

WHERE = Where("10.0.0.1", 22, "root", "/keys/id")
KEY = paramiko.Ed25519Key(data=bytes.fromhex("0000000b7373682d6564323535313900000020" + "00" * 32))


@pytest.mark.parametrize(("phase", "exc", "words"), [
    (Phase.TCP, TimeoutError("timed out"), "10.0.0.1:22: no TCP connection within 3s"),
    (Phase.BANNER, paramiko.SSHException("Error reading SSH protocol banner"),
     "10.0.0.1:22 accepted TCP but sent no SSH banner within 3s"),
    # paramiko's handshake limit may expire before its banner timer
    (Phase.BANNER, paramiko.SSHException("No existing session"),
     "10.0.0.1:22 accepted TCP but sent no SSH banner within 3s"),
    (Phase.KEX, paramiko.SSHException("No existing session"),
     "10.0.0.1:22: key exchange did not finish within 3s"),
    (Phase.KEX, paramiko.SSHException("Negotiation failed."),
     "10.0.0.1:22: key exchange did not finish within 3s"),
    (Phase.AUTH, paramiko.AuthenticationException("Authentication timeout."),
     "10.0.0.1:22: authentication did not finish within 3s"),
    (Phase.CHANNEL, paramiko.SSHException("Timeout opening channel."),
     "10.0.0.1:22: no session channel opened within 3s"),
])
def test_a_phase_that_runs_out_of_time_is_a_timeout_naming_it(
    phase: Phase, exc: BaseException, words: str
) -> None:
    failure = classify(exc, WHERE, phase, 3.0, 3.0)
    assert failure is not None
    assert (failure.kind, failure.message) == ("timeout", words)


def test_slow_authentication_is_never_auth_failed() -> None:
    failure = classify(paramiko.AuthenticationException("Authentication timeout."), WHERE,
                       Phase.AUTH, 0.5, 3.0)
    assert failure is not None and failure.kind == "timeout"


@pytest.mark.parametrize("exc", [
    paramiko.AuthenticationException("Authentication failed."),
    paramiko.BadAuthenticationType("Bad authentication type", ["password"]),
    paramiko.PasswordRequiredException("private key file is encrypted"),
])
def test_refused_credentials_are_auth_failed(exc: BaseException) -> None:
    failure = classify(exc, WHERE, Phase.AUTH, 0.1, 3.0)
    assert failure is not None and failure.kind == "auth_failed"
    assert "root@10.0.0.1:22" in failure.message and "/keys/id" in failure.message


def test_no_key_to_offer_at_all_is_auth_failed_and_says_where_keys_were_looked_for() -> None:
    # It was `error` ("SSH error ...: No authentication methods available"), as if the host
    # had done something wrong; ssh, with nothing to offer, is refused (publickey).
    failure = classify(paramiko.SSHException("No authentication methods available"),
                       Where("10.0.0.1", 22, "root", None), Phase.AUTH, 0.1, 3.0)
    assert failure is not None and failure.kind == "auth_failed"
    assert failure.message.startswith("no key to offer root@10.0.0.1:22")
    assert "IdentityAgent" in failure.message


def test_a_connection_dropped_during_authentication_with_one_key_is_not_auth_failed() -> None:
    # paramiko words it as an authentication failure; with one key given, sshd refused
    # nothing. With the agent's keys, sshd may have closed it over MaxAuthTries: refused.
    eof = paramiko.AuthenticationException(
        "Authentication failed: transport shut down or saw EOF")
    failure = classify(eof, WHERE, Phase.AUTH, 0.1, 3.0)
    assert failure is not None
    assert failure.kind == "unreachable"
    assert failure.message.startswith("10.0.0.1:22 closed the connection during auth (the key "
                                      "was not refused: sshd may have refused the account")
    agent = classify(eof, Where("10.0.0.1", 22, "root", None), Phase.AUTH, 0.1, 3.0)
    assert agent is not None and agent.kind == "auth_failed"


@pytest.mark.parametrize("exc", [
    paramiko.AuthenticationException("Authentication failed: transport shut down or saw EOF"),
    # paramiko's word for it where it had another key (or the agent's) to offer.
    paramiko.SSHException("No existing session"),
])
def test_what_sshd_said_as_it_closed_tells_a_refusal_from_a_drop(exc: BaseException) -> None:
    # With several keys (the files given, the agent's), sshd ends the connection after
    # MaxAuthTries refusals, saying so; its account checks (PAM) end it saying nothing.
    def kind(said: str, key: str | None) -> str:
        spot = where(Target("gpu01", "10.0.0.1", 22, "root", key), said)
        failure = classify(exc, spot, Phase.AUTH, 0.1, 3.0)
        assert failure is not None
        return failure.kind

    assert kind("Too many authentication failures", "/keys/id") == "auth_failed"
    assert kind("", "/keys/id") == "unreachable"
    assert kind("", None) == "unreachable"  # the agent's keys, none refused by sshd's words


@pytest.mark.parametrize(("phase", "exc", "words"), [
    (Phase.TCP, OSError(24, "Too many open files"), "out of file descriptors"),
    (Phase.BANNER, RuntimeError("can't start new thread"), "could not start a thread"),
])
def test_the_controllers_own_limits_are_not_blamed_on_the_host(
    phase: Phase, exc: BaseException, words: str
) -> None:
    # Were "unreachable: Too many open files", and a retried "MaxStartups is full".
    failure = classify(exc, WHERE, phase, 0.1, 3.0)
    assert failure is not None and failure.kind == "error" and words in failure.message


def test_refused_tcp_is_unreachable() -> None:
    failure = classify(ConnectionRefusedError(111, "Connection refused"), WHERE, Phase.TCP,
                       0.01, 3.0)
    assert failure is not None
    assert failure.message == "cannot connect to 10.0.0.1:22: connection refused"
    assert failure.kind == "unreachable"


def test_early_dropped_banner_is_retried() -> None:
    for exc in (paramiko.SSHException("Error reading SSH protocol banner"), EOFError()):
        assert classify(exc, WHERE, Phase.BANNER, 0.1, 3.0) is None


def test_unknown_and_changed_host_keys_name_the_fingerprint() -> None:
    unknown = classify(UnknownHostKey("10.0.0.1", KEY), WHERE, Phase.KEX, 0.1, 3.0)
    changed = classify(paramiko.BadHostKeyException("10.0.0.1", KEY, KEY), WHERE, Phase.KEX,
                       0.1, 3.0)
    for failure in (unknown, changed):
        assert failure is not None and failure.kind == "host_key_mismatch"
        assert "SHA256:" in failure.message


def test_the_phase_is_read_from_the_transport_state() -> None:
    class FakeTransport:  # only the fields phase_of reads
        remote_version = ""
        session_id = None
        authenticated = False

        def is_authenticated(self) -> bool:
            return self.authenticated

    t = FakeTransport()
    assert phase_of(t) is Phase.BANNER  # type: ignore[arg-type]
    t.remote_version = "SSH-2.0-OpenSSH_9.6"
    assert phase_of(t) is Phase.KEX  # type: ignore[arg-type]
    t.session_id = b"id"  # type: ignore[assignment]
    assert phase_of(t) is Phase.AUTH  # type: ignore[arg-type]
    t.authenticated = True
    assert phase_of(t) is Phase.CHANNEL  # type: ignore[arg-type]


def test_paramiko_reader_thread_errors_never_reach_stderr() -> None:
    import fleetclean.transport.session  # noqa: F401  (installs the handler)

    assert any(isinstance(h, logging.NullHandler)
               for h in logging.getLogger("paramiko").handlers)
