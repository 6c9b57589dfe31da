"""One SSH connection: a ``fabric.Connection`` built from fleetclean's resolved settings.

fleetclean hands fabric a finished socket (a TCP socket it connected itself, a channel
through a jump host, or a ProxyCommand's stdio) and a shared ``fabric.Config`` that reads no
ssh_config files: the hop chain is fleetclean's own (see ``pool``), and a fresh config per
host would cost controller CPU. Each phase of the connection gets its own time limit and, when
it runs out, its own message (see ``classify``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import fabric
import paramiko

from fleetclean.transport.base import Failed, TransportFailure
from fleetclean.transport.classify import Phase, Where, classify, phase_of
from fleetclean.transport.hops import Target
from fleetclean.transport.hostkeys import KnownHostsCache, apply

# sshd drops connections beyond MaxStartups before sending its banner; those are retried.
BANNER_RETRIES = 3
BANNER_BACKOFF_S = 0.15

Sock = Any  # a socket, a channel through a jump host, or a ProxyCommand


class Context:
    """What every connection of one run shares: options, host keys, parsed private keys."""

    def __init__(self, connect_timeout: float, known: KnownHostsCache, accept_new: bool) -> None:
        self.connect_timeout = connect_timeout
        self.known = known
        self.accept_new = accept_new
        self._lock = threading.Lock()
        self._keys: dict[str, paramiko.PKey | None] = {}
        # Empty SSHConfig: fabric must not read ~/.ssh/config and derive its own gateway
        # (one bastion connection per target, paramiko#664); lazy: no invoke config files.
        self.fabric_config = fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True)

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


class _Connection(fabric.Connection):  # type: ignore[misc]
    """fabric's Connection with one attribute declared that fabric 3.2 forgets.

    ``Connection.__init__`` ends with ``self.inline_ssh_env = ...``; the class does not
    declare that name, so invoke's config proxy stores it in the *shared* fabric.Config and
    re-merges it, emptying and refilling its data: a Connection built or opened meanwhile in
    another thread reads "No attribute or config key found for 'forward_agent'" (2 of 64
    hosts under load). Declared here, the assignment stays on the connection and the shared
    config is never written after it is built. (fabric/connection.py; no upstream issue
    found.)
    """

    inline_ssh_env = None


def where(target: Target) -> Where:
    return Where(target.address, target.port, target.user, target.key)


def tcp(target: Target, limit: float) -> socket.socket:
    """The TCP phase, done here so that its failure is told apart from the SSH phases."""
    started = time.monotonic()
    try:
        return socket.create_connection((target.address, target.port), timeout=limit)
    except OSError as exc:
        failure = classify(exc, where(target), Phase.TCP, time.monotonic() - started, limit)
        assert failure is not None
        raise Failed(failure) from exc


def _connection(target: Target, sock: Sock, ctx: Context, limit: float) -> Any:
    kwargs: dict[str, Any] = {
        "sock": sock,
        "look_for_keys": target.key is None,
        "allow_agent": target.key is None,
        "banner_timeout": limit,
        "auth_timeout": limit,
        "channel_timeout": limit,
    }
    if target.key:
        pkey = ctx.pkey(target.key)
        if pkey is not None:
            kwargs["pkey"] = pkey
        else:
            kwargs["key_filename"] = os.path.expanduser(target.key)
    conn = _Connection(
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
    apply(conn.client, ctx.known.get(target.options.get("userknownhostsfile")), accept_new)
    return conn


def open_connection(target: Target, ctx: Context, make_sock: Any) -> Any:
    """An open ``fabric.Connection`` to ``target``; ``make_sock()`` gives a fresh socket for
    each attempt (a banner dropped by a loaded sshd is retried). Raises ``Failed``."""
    limit = ctx.timeout_for(target)
    attempt = 0
    while True:
        attempt += 1
        sock = make_sock()
        conn = _connection(target, sock, ctx, limit)
        started = time.monotonic()
        try:
            conn.open()
            return conn
        except Exception as exc:
            phase = phase_of(conn.client.get_transport())
            conn.close()
            _close(sock)
            failure = classify(exc, where(target), phase, time.monotonic() - started, limit)
        if failure is not None:
            raise Failed(failure)
        if attempt > BANNER_RETRIES:
            raise Failed(TransportFailure(
                "unreachable",
                f"sshd at {target.where} closed the connection before its banner {attempt} "
                "times (MaxStartups?); retry with fewer --forks",
            ))
        time.sleep(BANNER_BACKOFF_S * attempt)


def _close(sock: Sock) -> None:
    try:
        sock.close()
    except Exception:  # already closed, or a ProxyCommand that is gone
        return
