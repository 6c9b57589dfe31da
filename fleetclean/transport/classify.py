"""Connection errors -> host outcomes a person can act on, one phase at a time.

A connection goes through phases (TCP connect, SSH banner, key exchange, authentication,
session channel, script); each has its own time limit, and a phase that runs out of time is a
``timeout`` that names it. ``auth_failed`` means the server refused the credentials, and
nothing else: a slow server that does not finish authentication in time is a ``timeout``
(paramiko raises ``AuthenticationException("Authentication timeout.")`` for both).

>>> where = Where("10.0.0.1", 22)
>>> classify(paramiko.AuthenticationException("Authentication timeout."), where,
...          Phase.AUTH, 10.0, 10).message
'10.0.0.1:22: authentication did not finish within 10s'
>>> classify(paramiko.AuthenticationException("Authentication failed."), where,
...          Phase.AUTH, 0.1, 10).kind
'auth_failed'
>>> classify(EOFError(), where, Phase.BANNER, 0.1, 10) is None  # dropped early: retry
True
"""

from __future__ import annotations

import enum
import errno
import getpass
import os
import socket
from dataclasses import dataclass

from fleetclean.transport.base import TransportFailure
from fleetclean.transport.hostkeys import HostKeyRefused, UnknownHostKey, fingerprint
from fleetclean.transport.sshlib import paramiko


class Phase(str, enum.Enum):
    TCP = "tcp"
    BANNER = "banner"
    KEX = "kex"
    AUTH = "auth"
    CHANNEL = "channel"
    SCRIPT = "script"


_TIMEOUT_WORDS = {
    Phase.TCP: "no TCP connection within {t}",
    Phase.BANNER: "accepted TCP but sent no SSH banner within {t}",
    Phase.KEX: "key exchange did not finish within {t}",
    Phase.AUTH: "authentication did not finish within {t}",
    Phase.CHANNEL: "no session channel opened within {t}",
    Phase.SCRIPT: "script still running after {t}",
}


@dataclass(frozen=True)
class Where:
    """The endpoint a failure is about, as a person names it."""

    address: str
    port: int
    user: str | None = None
    key: str | None = None
    # What sshd said as it closed the connection (its DISCONNECT message), "" where it said
    # nothing; None where that is not known.
    said: str | None = None
    # The name known_hosts knows the host by, where ssh_config gives one (HostKeyAlias).
    alias: str | None = None

    def __str__(self) -> str:
        return f"{self.address}:{self.port}"


def phase_of(transport: paramiko.Transport | None) -> Phase:
    """The first phase a (failed) SSH transport did not complete.

    >>> phase_of(None)
    <Phase.BANNER: 'banner'>
    """
    if transport is None or not transport.remote_version:
        return Phase.BANNER
    if transport.session_id is None:
        return Phase.KEX
    return Phase.AUTH if not transport.is_authenticated() else Phase.CHANNEL


def timed_out(where: Where, phase: Phase, limit: float) -> TransportFailure:
    """``timeout`` naming the phase.

    >>> timed_out(Where("h", 22), Phase.BANNER, 3).message
    'h:22 accepted TCP but sent no SSH banner within 3s'
    """
    words = _TIMEOUT_WORDS[phase].format(t=f"{limit:g}s")
    sep = " " if phase is Phase.BANNER else ": "
    return TransportFailure("timeout", f"{where}{sep}{words}")


def _is_timeout(exc: BaseException, elapsed: float, limit: float) -> bool:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return True
    text = str(exc).lower()
    # paramiko words its own timers' expiry as "... timeout", and a silent peer makes its
    # handshake limit race the banner timer (the loser says "No existing session").
    return "timeout" in text or "timed out" in text or elapsed >= limit * 0.9


def _key_failure(exc: BaseException, where: Where) -> TransportFailure | None:
    # A host known by its HostKeyAlias is named by both: the key is looked for, and
    # recorded, under the alias.
    aka = f" (HostKeyAlias {where.alias})" if where.alias else ""
    if isinstance(exc, UnknownHostKey):
        named = f"{exc.hostname} (HostKeyAlias of {where})" if where.alias else exc.hostname
        what = (f"unknown host key for {named} ({exc.key.get_name()} "
                f"{fingerprint(exc.key)})")
        if exc.read_only:  # as ssh, which records nothing where it has no user file
            return TransportFailure(
                "host_key_mismatch", f"{what}; UserKnownHostsFile is none, so no key is "
                "accepted as new: check it, then add it to a known_hosts file this host's "
                "config names, or give --known-hosts FILE")
        return TransportFailure(
            "host_key_mismatch",
            f"{what}; check it, then rerun with --accept-new-host-keys or add it to "
            "known_hosts",
        )
    if isinstance(exc, HostKeyRefused):
        return TransportFailure(
            "host_key_mismatch",
            f"{where}{aka}: {exc.reason}; nothing was run",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportFailure(
            "host_key_mismatch",
            f"host key for {where}{aka} CHANGED (now {fingerprint(exc.key)}, known "
            f"{fingerprint(exc.expected_key)}); nothing was run. If the host was "
            f"reinstalled, remove the old key{' of ' + where.alias if where.alias else ''} "
            "from known_hosts",
        )
    if isinstance(exc, FileNotFoundError) and where.key and exc.filename:
        return TransportFailure(
            "auth_failed",
            f"private key {exc.filename} not found (ansible_ssh_private_key_file or "
            "IdentityFile names a file that does not exist here)",
        )
    return None


NO_KEY = "no key to offer "
# paramiko's default key files, in the order it tries them (SSHClient._auth, look_for_keys).
DEFAULT_KEYS = tuple(f"~/.ssh/id_{kind}" for kind in ("rsa", "dsa", "ecdsa", "ed25519"))


def no_key(user_at: str, jump: str | None = None) -> str:
    """Why a login had no key to offer ``user_at`` (``user@address:port``): where keys were
    looked for; for a jump host (``jump``: its name), only what ssh offers one.

    >>> no_key("root@10.0.0.1:22", "bastion")  # doctest: +NORMALIZE_WHITESPACE
    "no key to offer root@10.0.0.1:22: a jump host is offered its own IdentityFile (Host
    bastion in ssh_config), else ~/.ssh/id_*, and the agent's keys (IdentityAgent, else
    $SSH_AUTH_SOCK), never the inventory's key: none is there"
    """
    if jump is None:
        return (f"{NO_KEY}{user_at}: no identity file (IdentityFile, "
                "ansible_ssh_private_key_file, ~/.ssh/id_*) and no key in the agent "
                "(IdentityAgent, else $SSH_AUTH_SOCK)")
    return (f"{NO_KEY}{user_at}: a jump host is offered its own IdentityFile (Host {jump} in "
            "ssh_config), else ~/.ssh/id_*, and the agent's keys (IdentityAgent, else "
            "$SSH_AUTH_SOCK), never the inventory's key: none is there")


def _encrypted(where: Where) -> str:
    """What to do about an encrypted private key paramiko was not given a passphrase for
    (fleetclean asks none, ssh would): the one given (else the default files there) that
    is encrypted, to add to the agent. Only on this failure: the files are read here."""
    paths = [where.key] if where.key else [os.path.expanduser(k) for k in DEFAULT_KEYS]
    found = []
    for path in paths:
        try:
            paramiko.PKey.from_path(os.path.expanduser(path))
        except (paramiko.PasswordRequiredException, TypeError) as exc:
            # cryptography's loader: TypeError "Key is password-protected, but password
            # was not provided"
            if isinstance(exc, paramiko.PasswordRequiredException) or "password" in str(exc):
                found.append(path)
        except Exception:  # not there, unreadable, another format: not this one
            continue
    named = " ".join(found) or where.key or "KEY"
    return (f"private key {named} is encrypted: add it to your agent (ssh-add {named}); "
            "fleetclean asks for no passphrase")


def _refused(exc: BaseException, where: Where) -> TransportFailure:
    user = where.user or getpass.getuser()
    # sshd's own words where it gave any ("Too many authentication failures").
    words = f" (sshd: {where.said})" if where.said else ""
    why = _encrypted(where) if isinstance(exc, paramiko.PasswordRequiredException) else exc
    return TransportFailure(
        "auth_failed",
        f"authentication failed for {user}@{where} with key "
        f"{where.key or '(agent/default keys)'}: {why}{words}",
    )


def _definite(exc: BaseException, where: Where, phase: Phase) -> TransportFailure | None:
    """Failures that time cannot explain: keys, refusals, a closed port."""
    known = _key_failure(exc, where)
    if known is not None:
        return known
    # The controller's own limits, not the host's doing: no file descriptor (ulimit -n),
    # no thread (ulimit -u). Told as such, never retried as sshd's MaxStartups.
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return TransportFailure("error", f"cannot connect to {where}: this machine is out "
                                "of file descriptors; lower --forks or raise ulimit -n")
    if isinstance(exc, RuntimeError) and "start new thread" in str(exc):
        return TransportFailure("error", f"cannot connect to {where}: this machine could not "
                                "start a thread; lower --forks or raise ulimit -u")
    if isinstance(exc, paramiko.ChannelException):
        return TransportFailure("unreachable", f"the bastion cannot reach {where}: {exc.text}")
    if phase is Phase.TCP and not isinstance(exc, (socket.timeout, TimeoutError)):
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else (
            getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)
        return TransportFailure("unreachable", f"cannot connect to {where}: {reason}")
    if type(exc) is paramiko.SSHException and str(exc) == "No authentication methods available":
        # paramiko had no key to offer at all, where ssh offers none and is refused
        # ("Permission denied (publickey)"): the same outcome, with what was looked for.
        user = where.user or getpass.getuser()
        return TransportFailure("auth_failed", no_key(f"{user}@{where}"))
    refused = isinstance(exc, paramiko.PasswordRequiredException) or (
        isinstance(exc, paramiko.AuthenticationException) and not _is_timeout(exc, 0, 1)
        and not _dropped_in_auth(exc, where)) or (
        phase is Phase.AUTH and str(exc) == "No existing session" and where.said is not None
        and not _dropped_in_auth(exc, where))
    return _refused(exc, where) if refused else None


def _dropped_in_auth(exc: BaseException, where: Where) -> bool:
    """paramiko words a connection that ended during authentication as an authentication
    failure ("transport shut down or saw EOF"), or, where it had another key to offer, as
    "No existing session". sshd ends it that way after too many refused keys
    (MaxAuthTries), saying so first ("Too many authentication failures"): a refusal. Ended
    without those words, the connection dropped: sshd's account checks after an accepted key
    (PAM: pam_slurm_adopt, pam_access) end it with nothing said. Where sshd's words are not
    known, only a connection with one key given counts as dropped."""
    ended = ((isinstance(exc, paramiko.AuthenticationException) and "saw EOF" in str(exc))
             or (type(exc) is paramiko.SSHException and str(exc) == "No existing session"))
    if not ended:
        return False
    if where.said is None:
        return where.key is not None
    return "authentication failures" not in where.said.lower()


def classify(
    exc: BaseException, where: Where, phase: Phase, elapsed: float, limit: float
) -> TransportFailure | None:
    """Turn an error raised in ``phase`` into a failure; None for a banner dropped early
    (sshd over its MaxStartups), which is worth retrying."""
    definite = _definite(exc, where, phase)
    if definite is not None:
        return definite
    if _is_timeout(exc, elapsed, limit):
        return timed_out(where, phase, limit)
    if phase is Phase.BANNER:
        return None
    if _dropped_in_auth(exc, where):
        # After the key, sshd's account checks (PAM: pam_slurm_adopt with no job of the
        # user's there, pam_access; AllowUsers) end the connection the same way.
        return TransportFailure(
            "unreachable", f"{where} closed the connection during auth (the key was not "
            "refused: sshd may have refused the account, e.g. PAM or AllowUsers)")
    if isinstance(exc, (EOFError, ConnectionError)):
        return TransportFailure(
            "unreachable", f"{where} closed the connection during {phase.value}")
    if isinstance(exc, paramiko.SSHException):
        return TransportFailure("error", f"SSH error with {where}: {exc}")
    return TransportFailure("error", f"{where}: {type(exc).__name__}: {exc}")
