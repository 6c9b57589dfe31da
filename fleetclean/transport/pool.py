"""Jump-host connections shared by the whole run, and the sockets through them.

This is where fleetclean works around fabric's gateway handling, all in one place:

- a gateway derived from ssh_config opens a new bastion connection for every target, which
  sshd's MaxStartups then refuses (https://github.com/paramiko/paramiko/issues/664): here
  there is **one connection per distinct hop chain** (and per prefix of it), shared by every
  host behind it;
- ``Connection.open_gateway`` opens its ``direct-tcpip`` channel with no timeout
  (https://github.com/fabric/fabric/issues/2197): here every channel is opened with the
  connect timeout;
- ``ProxyJump none`` is read as a host called "none"
  (https://github.com/fabric/fabric/issues/2354): ``hops.resolve`` drops it;
- multi-hop ``ProxyJump a,b`` is broken (https://github.com/fabric/fabric/issues/2203,
  https://github.com/fabric/fabric/issues/1935): here each hop is its own
  ``fabric.Connection`` whose ``sock`` is a channel through the previous one;
- ``Connection`` adds unknown host keys silently: ``connect`` puts fleetclean's policy on
  every hop's client as on the target's.

A hop that fails is named in the failure of every host behind it
(``bastion b2 (10.0.0.2:22) unreachable: connection refused``), and that failure is kept for
the run, so 200 hosts behind a dead bastion do not each wait out the connect timeout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import paramiko

from fleetclean.transport.base import Failed, TransportFailure
from fleetclean.transport.classify import Phase, Where, timed_out
from fleetclean.transport.connect import Context, Sock, open_connection, tcp
from fleetclean.transport.hops import Route, Target

ChainKey = tuple[tuple[str, int, str | None, str | None], ...]


class HopSocket:
    """A channel through a jump host, used as the inner connection's socket, with send and
    close serialized.

    paramiko's ``Channel.send`` checks ``closed`` under its lock but sends after releasing
    it, so an inner transport that closes while its reader thread answers the server's
    CHANNEL_CLOSE can put data on the wire after the close. sshd then drops the whole
    bastion connection ("data packet referred to nonexistent channel"), and with it every
    host behind it: seen with 20 hosts behind one bastion.
    """

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._lock = threading.Lock()
        self._closed = False

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._closed:
                raise OSError("hop channel closed")
            return self._chan.send(data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._chan.close()

    def __getattr__(self, name: str) -> Any:  # recv, settimeout, fileno, ...
        return getattr(self._chan, name)


def channel(conn: Any, via: Target, to: Target, limit: float) -> HopSocket:
    """A ``direct-tcpip`` channel through ``conn`` (to ``via``) to ``to``, with a timeout."""
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise Failed(TransportFailure(
            "unreachable", f"cannot connect to {to.where}: connection to {via.name} lost"))
    try:
        chan: paramiko.Channel = transport.open_channel(
            "direct-tcpip", (to.address, to.port), ("127.0.0.1", 0), timeout=limit
        )
    except paramiko.ChannelException as exc:
        reason = (exc.text or "refused").lower()
        raise Failed(TransportFailure(
            "unreachable", f"cannot connect to {to.where}: {reason} (from {via.name})"
        )) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise Failed(timed_out(Where(to.address, to.port), Phase.TCP, limit)) from exc
    return HopSocket(chan)


def name_hop(failure: TransportFailure, hop: Target) -> TransportFailure:
    """The failure of a jump host, worded so the user checks the right machine.

    >>> hop = Target("b2", "10.0.0.2", 22, None, None)
    >>> name_hop(TransportFailure("unreachable",
    ...          "cannot connect to 10.0.0.2:22: connection refused"), hop).message
    'bastion b2 (10.0.0.2:22) unreachable: connection refused'
    """
    prefix = f"cannot connect to {hop.where}: "
    if failure.kind == "unreachable" and failure.message.startswith(prefix):
        reason = failure.message[len(prefix):]
        return TransportFailure("unreachable", f"bastion {hop.name} ({hop.where}) "
                                f"unreachable: {reason}")
    return TransportFailure(failure.kind, f"bastion {hop.name} ({hop.where}): {failure.message}")


class Pool:
    """One open connection per hop chain; failures of a hop kept for the run."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._locks: dict[ChainKey, threading.Lock] = {}
        self._conns: dict[ChainKey, Any] = {}
        self._failures: dict[ChainKey, TransportFailure] = {}

    def sock_maker(self, route: Route, target: Target) -> Callable[[], Sock]:
        """A function giving a fresh socket to ``target`` along ``route`` per call."""
        limit = self._ctx.timeout_for(target)
        if route.hops:
            last = self._chain(route.hops)
            return lambda: channel(last, route.hops[-1], target, limit)
        command = route.proxy_command
        if command:
            return lambda: paramiko.ProxyCommand(command)
        return lambda: tcp(target, limit)

    def _chain(self, hops: tuple[Target, ...]) -> Any:
        conn: Any = None
        for i, hop in enumerate(hops):
            conn = self._hop(tuple(h.ident for h in hops[: i + 1]), hop, conn,
                             hops[i - 1] if i else None)
        return conn

    def _hop(self, key: ChainKey, hop: Target, before: Any, via: Target | None) -> Any:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._failures:
                raise Failed(self._failures[key])
            conn = self._conns.get(key)
            if conn is not None and conn.is_connected:
                return conn
            limit = self._ctx.timeout_for(hop)
            make: Callable[[], Sock]
            if before is None:
                make = lambda: tcp(hop, limit)  # noqa: E731
            else:
                assert via is not None
                make = lambda: channel(before, via, hop, limit)  # noqa: E731
            try:
                conn = open_connection(hop, self._ctx, make)
            except Failed as exc:
                failure = self._failures[key] = name_hop(exc.failure, hop)
                raise Failed(failure) from exc
            self._conns[key] = conn
            return conn

    def close(self) -> None:
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        # Last hop first: closing a bastion under a live inner connection cuts it mid-close.
        for conn in reversed(conns):
            with contextlib.suppress(Exception):  # a hop that is already gone
                conn.close()
