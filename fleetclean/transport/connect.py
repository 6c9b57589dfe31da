"""One SSH connection: a ``fabric.Connection`` built from fleetclean's resolved settings.

fleetclean hands fabric a finished socket (a TCP socket it connected itself, a channel
through a jump host, or a ProxyCommand's stdio) and a shared ``fabric.Config`` that reads no
ssh_config files: the hop chain is fleetclean's own (see ``pool``), and a fresh config per
host would cost controller CPU (see ``upstream``). Each phase of the connection gets its
own time limit and, when it runs out, its own message (see ``classify``); new connections to
one sshd are paced (see ``pace``).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from fleetclean.transport import dialing
from fleetclean.transport.base import Failed, TransportFailure
from fleetclean.transport.classify import Phase, Where, classify, phase_of
from fleetclean.transport.hops import Target
from fleetclean.transport.hostkeys import (
    KnownHostsCache,
    apply,
    apply_given,
    host_key_name,
    key_name,
)
from fleetclean.transport.pace import Startups, backoff
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import (
    Connection,
    HopSocket,
    ProxySock,
    SocketAgent,
    TcpSock,
    agent_for,
    running,
    shared_config,
    transport,
)

# sshd drops connections beyond MaxStartups before sending its banner; those are retried
# (with a growing pause, see pace.backoff) while the connect timeout lasts.
MAX_ATTEMPTS = 8

Sock = Any  # a socket, a channel through a jump host, or a ProxyCommand


class Context:
    """What every connection of one run shares: options, host keys, parsed private keys."""

    def __init__(self, connect_timeout: float, known: KnownHostsCache, accept_new: bool) -> None:
        self.connect_timeout = connect_timeout
        self.known = known
        self.accept_new = accept_new
        self._lock = threading.Lock()
        self._keys: dict[str, paramiko.PKey | None] = {}
        self.fabric_config = shared_config()
        self.startups = Startups()

    def pkey(self, path: str) -> paramiko.PKey | None:
        """The private key at ``path``, parsed once per run (not once per host); None when
        it cannot be loaded unaided (passphrase, odd format): paramiko then loads it itself
        and reports the error for that host."""
        with self._lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(os.path.expanduser(path))
                except Exception:  # any failure: let connect() report it
                    self._keys[path] = None
            return self._keys[path]

    def timeout_for(self, target: Target) -> float:
        return float(target.options.get("connecttimeout", self.connect_timeout))


def where(target: Target, said: str | None = None) -> Where:
    alias = target.options.get("hostkeyalias")
    return Where(target.address, target.port, target.user, target.key, said,
                 key_name(target.address, target.port, alias) if alias else None)


def tcp(target: Target, limit: float) -> TcpSock:
    """The TCP phase, done here so that its failure is told apart from the SSH phases."""
    dialing.note(Phase.TCP.value)
    started = time.monotonic()
    try:
        return TcpSock(socket.create_connection((target.address, target.port), timeout=limit))
    except OSError as exc:
        failure = classify(exc, where(target), Phase.TCP, time.monotonic() - started, limit)
        assert failure is not None
        raise Failed(failure) from exc


def _usable(target: Target) -> tuple[str, ...]:
    """The identity files to offer: ssh skips one that is not there ("no such identity")
    and offers the next, so a missing first file must not stop the login (paramiko stops at
    it). Where none is there, ssh goes on with the agent's keys, and so does this (a team's
    inventory names ~/.ssh/cluster_key, which lives in this laptop's agent, 1Password's);
    where the agent is off too (IdentitiesOnly), all are kept: the error names the missing
    one."""
    there = tuple(k for k in target.keys if os.path.exists(os.path.expanduser(k)))
    return there or (() if target.agent else target.keys)


def _missing_note(target: Target) -> str:
    """What to add to a refused login where no identity file was there ("" otherwise)."""
    if not target.keys or _usable(target):
        return ""
    return f"identity file {target.key} is not here; the agent's keys were offered instead"


def _tokens(target: Target) -> dict[str, str]:
    """ssh_config's ``%`` tokens for ``target`` (those an ``IdentityAgent`` path uses)."""
    local = getpass.getuser()
    host = socket.gethostname()
    return {"d": os.path.expanduser("~"), "u": local, "i": str(os.getuid()),
            "h": target.address, "p": str(target.port), "r": target.user or local,
            "n": target.name, "l": host, "L": host.split(".", 1)[0]}


def _connection(target: Target, sock: Sock, ctx: Context, limit: float) -> Any:
    keys = _usable(target)
    alias = target.options.get("hostkeyalias")
    known = ctx.known.get(target.options.get("userknownhostsfile"),
                          target.options.get("globalknownhostsfile"),
                          target.options.get("revokedhostkeys"))
    kwargs: dict[str, Any] = {
        "sock": sock,
        # As ssh: the default key files only where no identity file is given; the agent's
        # keys unless IdentitiesOnly. paramiko asks the agent only after the files given
        # are refused, so a working key costs no agent round trip.
        "look_for_keys": not target.keys,
        "allow_agent": target.agent,
        "banner_timeout": limit,
        "auth_timeout": limit,
        "channel_timeout": limit,
        # paramiko gives the key exchange 15 s of its own (handshake_timeout), whatever the
        # connect timeout: a longer --connect-timeout was cut to 15 s there and read as a
        # closed connection, not a timeout.
        # A host that an @cert-authority line names is asked for its certificate first.
        "transport_factory": functools.partial(
            transport, handshake_timeout=limit,
            certs_first=known.vouched(key_name(target.address, target.port, alias),
                                      aliased=bool(alias))),
    }
    if keys:
        # The first key parsed once per run; every other one (or the first, where it needs
        # what only paramiko's own loader reports: a passphrase, an odd format) by name.
        pkey = ctx.pkey(keys[0])
        if pkey is not None:
            kwargs["pkey"] = pkey
        files = [os.path.expanduser(k) for k in (keys[1:] if pkey is not None else keys)]
        if files:
            kwargs["key_filename"] = files
    conn = Connection(
        target.address,
        user=target.user,
        port=target.port,
        config=ctx.fabric_config,
        gateway=False,
        connect_timeout=max(1, int(limit)),
        connect_kwargs=kwargs,
    )
    # fabric keeps connect_timeout as an int (1.5 s would become 1 s, 0.5 s no limit at all):
    # the key exchange gets the real figure.
    conn.connect_timeout = limit
    strict = target.options.get("stricthostkeychecking", "").lower()
    accept_new = ctx.accept_new or strict in ("accept-new", "no", "off")
    # fabric's Connection trusts unknown host keys (AutoAddPolicy): replaced, on every hop.
    agent = target.options.get("identityagent") if target.agent else None
    socket_path = agent_for(agent, _tokens(target)) if agent else None
    if socket_path is not None:
        conn.client._agent = SocketAgent(socket_path)  # see upstream: IdentityAgent
    hashed = target.options.get("hashknownhosts", "no").lower() in ("yes", "true")
    apply(conn.client, known, accept_new, hashed, alias)
    return conn


def open_connection(target: Target, ctx: Context, make_sock: Any, pace: object = None) -> Any:
    """An open ``fabric.Connection`` to ``target``; raises ``Failed``.

    ``make_sock()`` gives a fresh socket for each attempt. Each attempt waits for a slot of
    the sshd it starts a connection on (``pace``, by default the target's address and port;
    see ``pace``) and holds it until authenticated. A connection sshd drops before its
    banner (MaxStartups), or one whose jump host went away under it, is tried again after a
    growing pause while the connect timeout lasts.
    """
    limit = ctx.timeout_for(target)
    key = pace if pace is not None else (target.address, target.port)
    return _retrying(ctx, key, limit, target.where,
                     lambda: _attempt(target, ctx, make_sock(), limit))


def open_given(conn: Any, ctx: Context) -> Any:
    """A caller's own ``fabric.Connection``, opened (unless it is open) the way fleetclean
    opens its own: fleetclean's host-key policy on it and on a ``Connection`` gateway, each
    phase within the connect timeout unless the caller set one, pacing and retries, failures
    classified. Its route (``gateway``) is fabric's. Raises ``Failed``."""
    if conn.is_connected:
        return conn
    if conn.connect_timeout is None:
        conn.connect_timeout = ctx.connect_timeout
    limit = float(conn.connect_timeout)
    for name in ("banner_timeout", "auth_timeout", "channel_timeout"):
        conn.connect_kwargs.setdefault(name, limit)
    hop: Any = conn
    known = ctx.known.get(None)
    while hop is not None and not isinstance(hop, str):
        apply_given(hop.client, known, ctx.accept_new)
        if (known.vouched(host_key_name(str(hop.host), int(hop.port)))
                and "transport_factory" not in hop.connect_kwargs):
            # A host that a CA vouches for is asked for its certificate first; a copy,
            # since fabric may share one dict between connections.
            hop.connect_kwargs = {**hop.connect_kwargs, "transport_factory":
                                  functools.partial(transport, certs_first=True)}
        hop = hop.gateway
    spot = Where(str(conn.host), int(conn.port), conn.user)
    return _retrying(ctx, (spot.address, spot.port), limit, str(spot),
                     lambda: _attempt_given(conn, spot, limit))


def _retrying(
    ctx: Context, key: object, limit: float, where: str,
    attempt: Callable[[], tuple[Any, TransportFailure | None, str | None]],
) -> Any:
    first = time.monotonic()
    tries = 0
    while True:
        tries += 1
        dialing.note(dialing.SLOT)
        with ctx.startups.slot(key):
            conn, failure, again = attempt()
        if conn is not None:
            return conn
        if again == "dropped":
            ctx.startups.dropped(key)
        pause = backoff(tries)
        if again is None or tries >= MAX_ATTEMPTS or time.monotonic() - first + pause > limit:
            raise Failed(failure or _gave_up(where, tries, time.monotonic() - first))
        dialing.note(dialing.RETRY)
        time.sleep(pause)


def _attempt_given(
    conn: Any, spot: Where, limit: float
) -> tuple[Any, TransportFailure | None, str | None]:
    started = time.monotonic()
    dialing.note(conn)
    try:
        conn.open()
        return conn, None, None
    except Exception as exc:
        phase = phase_of(conn.client.get_transport())
        with contextlib.suppress(Exception):
            conn.close()
        failure = classify(exc, spot, phase, time.monotonic() - started, limit)
    return None, failure, "dropped" if failure is None else None


def _attempt(
    target: Target, ctx: Context, sock: Sock, limit: float
) -> tuple[Any, TransportFailure | None, str | None]:
    """(open connection, None, None), or (None, failure, why it is worth another try:
    "dropped", "hop lost" or None)."""
    conn = _connection(target, sock, ctx, limit)
    started = time.monotonic()
    dialing.note(conn)
    try:
        conn.open()
        running(conn)
        return conn, None, None
    except Exception as exc:
        transport = conn.client.get_transport()
        phase = phase_of(transport)
        said = getattr(transport, "said", None)
        refused = getattr(transport, "refused", 0)
        agent = getattr(conn.client, "_agent", None)  # gone once the client is closed
        unreached = agent.error if isinstance(agent, SocketAgent) else ""
        if refused and type(exc) is paramiko.SSHException and str(exc) != "No existing session":
            # A refusal that paramiko's last key-file parser error hid (upstream._Transport).
            exc = paramiko.AuthenticationException(
                f"Authentication failed ({refused} key(s) refused; last: {exc})")
        conn.close()
        _close(sock)
        failure = classify(exc, where(target, said), phase, time.monotonic() - started, limit)
    if isinstance(sock, HopSocket) and sock.hop_lost():
        return None, failure, "hop lost"
    note = sock.note() if isinstance(sock, ProxySock) else ""
    if failure is None and note and "kex_exchange_identification" not in note:
        # The ProxyCommand itself failed (a name it cannot resolve, a refused key): no
        # retry will change that.
        return None, TransportFailure("unreachable", note), None
    if failure is not None and note:
        failure = TransportFailure(failure.kind, f"{failure.message} ({note})")
    if failure is not None and failure.kind == "auth_failed":
        for said in (unreached, _missing_note(target)):
            if said:
                failure = TransportFailure(failure.kind, f"{failure.message} ({said})")
    return None, failure, "dropped" if failure is None else None


def _gave_up(where: str, attempt: int, elapsed: float) -> TransportFailure:
    return TransportFailure(
        "unreachable",
        f"sshd at {where} closed the connection before its banner {attempt} times "
        f"in {elapsed:.0f}s (its MaxStartups is full); retry later or with fewer --forks",
    )
def _close(sock: Sock) -> None:
    try:
        sock.close()
    except Exception:  # already closed, or a ProxyCommand that is gone
        return
