"""Jump-host connections shared by the whole run, and the sockets through them.

**One connection per distinct hop chain** (and per prefix of it), shared by every host
behind it, instead of fabric's one bastion connection per target (see ``upstream``): a
hundred hosts behind one bastion cost it one login and one MaxStartups slot. Each host gets
its own ``direct-tcpip`` channel through the last hop, opened with the connect timeout; sshd
does not count those against ``MaxSessions`` (see ``pace``).

A bastion can still run out of room on one connection: each forwarded channel is a socket of
its sshd process (OpenSSH's sshd-session has the usual 1024 open files), and other servers
cap channels per connection (Dropbear refuses past its MAX_CHANNELS with "resource
shortage"). So the last hop's connection is a *lane*: at most ``CHANNELS_PER_LANE`` channels
each, a lane that refuses a channel as prohibited or short of resources while it carries
others is full at that count, and then another lane (another connection to the same
bastion, paced like any other) takes the next hosts, up to ``MAX_LANES``. A lane whose
connection drops is replaced for the hosts that have not started yet.

A hop that fails is named in the failure of every host behind it
(``bastion b2 (10.0.0.2:22) unreachable: connection refused``), and that failure is kept for
the run, so 200 hosts behind a dead bastion do not each wait out the connect timeout.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from fleetclean.transport import dialing
from fleetclean.transport.base import Failed, TransportFailure
from fleetclean.transport.classify import NO_KEY, Phase, Where, no_key, timed_out
from fleetclean.transport.connect import Context, Sock, open_connection, tcp
from fleetclean.transport.hops import Ident, Route, Target, expand
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import HopSocket, ProxySock

ChainKey = tuple[Ident, ...]
CHANNELS_PER_LANE = 256
MAX_LANES = 8
_FULL = (paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
         paramiko.common.OPEN_FAILED_RESOURCE_SHORTAGE)


class _Refused(Exception):
    def __init__(self, code: int, failure: TransportFailure) -> None:
        super().__init__(failure.message)
        self.code = code
        self.failure = failure


class _Lost(Exception):
    """The lane's connection to the jump host is gone."""


def channel(conn: Any, via: Target, to: Target, limit: float) -> paramiko.Channel:
    """A ``direct-tcpip`` channel through ``conn`` (to ``via``) to ``to``, with a timeout."""
    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise _Lost(via.name)
    try:
        chan: paramiko.Channel = transport.open_channel(
            "direct-tcpip", (to.address, to.port), ("127.0.0.1", 0), timeout=limit
        )
        return chan
    except paramiko.ChannelException as exc:
        reason = (exc.text or "refused").lower()
        raise _Refused(exc.code, TransportFailure(
            "unreachable", f"cannot connect to {to.where}: {reason} (from {via.name})"
        )) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if not transport.is_active():
            raise _Lost(via.name) from exc
        raise Failed(timed_out(Where(to.address, to.port), Phase.TCP, limit)) from exc


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
    message = f"bastion {hop.name} ({hop.where}): {failure.message}"
    if failure.kind == "auth_failed" and failure.message.startswith(NO_KEY):
        # Not the node's places (the inventory's key): only what a jump host is offered.
        user_at = failure.message[len(NO_KEY):].split(": ", 1)[0]
        return TransportFailure(failure.kind, f"bastion {hop.name} ({hop.where}): "
                                f"{no_key(user_at, hop.name)}")
    if failure.kind == "auth_failed" and not hop.keys:
        # An inventory that names one key for its bastion and its nodes alike, which ssh
        # never offers the bastion: where that key must be named for it.
        message += (f"; as by ssh, a jump host is offered its own IdentityFile (Host "
                    f"{hop.name} in ssh_config), else ~/.ssh/id_*, and the agent's keys, "
                    "never the inventory's key")
    return TransportFailure(failure.kind, message)


class _Lane:
    """One connection to a last hop, and how many hosts' channels it carries."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.channels = 0
        self.full_at = CHANNELS_PER_LANE

    def alive(self) -> bool:
        return bool(self.conn.is_connected)


def _proxy(command: str) -> ProxySock:
    dialing.note(dialing.PROXY)
    return ProxySock(command)


class Pool:
    """Open connections per hop chain; failures of a hop kept for the run."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._locks: dict[ChainKey, threading.Lock] = {}
        self._conns: dict[ChainKey, Any] = {}
        self._lanes: dict[ChainKey, list[_Lane]] = {}
        self._failures: dict[ChainKey, TransportFailure] = {}

    def sock_maker(self, route: Route, target: Target) -> Callable[[], Sock]:
        """A function giving a fresh socket to ``target`` along ``route`` per call."""
        limit = self._ctx.timeout_for(target)
        if route.hops:
            return lambda: self.channel_to(route.hops, target, limit)
        command = route.proxy_command
        if command:
            return lambda: _proxy(command)
        return lambda: tcp(target, limit)

    def channel_to(self, hops: tuple[Target, ...], target: Target, limit: float) -> HopSocket:
        """A channel to ``target`` through the last of ``hops``, on a lane with room."""
        dialing.note(dialing.THROUGH)
        key: ChainKey = tuple(h.ident for h in hops)
        for _ in range(2 * MAX_LANES):
            lane = self._lane(hops, key)
            dialing.note(dialing.THROUGH)  # after a jump host this thread connected itself
            try:
                chan = channel(lane.conn, hops[-1], target, limit)
            except _Refused as exc:
                with self._lock:
                    lane.channels -= 1
                    busy = lane.channels > 0
                    if busy and exc.code in _FULL:
                        lane.full_at = lane.channels
                if busy and exc.code in _FULL:
                    continue
                raise Failed(exc.failure) from exc
            except BaseException as exc:
                with self._lock:
                    lane.channels -= 1
                if isinstance(exc, _Lost):
                    continue  # _lane drops the dead lane and reconnects
                raise
            return HopSocket(chan, on_close=lambda lane=lane: self._release(lane))
        raise Failed(TransportFailure(
            "unreachable", f"bastion {hops[-1].name} ({hops[-1].where}) keeps refusing or "
            f"dropping its connections; {target.where} not reached"))

    def _release(self, lane: _Lane) -> None:
        with self._lock:
            lane.channels -= 1

    def _lane(self, hops: tuple[Target, ...], key: ChainKey) -> _Lane:
        """A live lane with room, one channel reserved on it; a new one when all are full."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._failures:
                raise Failed(self._failures[key])
            lanes = self._lanes[key] = [ln for ln in self._lanes.get(key, []) if ln.alive()]
            with self._lock:
                roomy = [ln for ln in lanes if ln.channels < ln.full_at]
                if roomy or len(lanes) >= MAX_LANES:
                    lane = min(roomy or lanes, key=lambda ln: ln.channels)
                    lane.channels += 1
                    return lane
            try:
                conn = self._hop(key, hops, self._chain(hops[:-1]), remember=not lanes)
            except Failed:
                if not lanes:
                    raise
                with self._lock:  # a second lane would not come: share the first ones
                    lane = min(lanes, key=lambda ln: ln.channels)
                    lane.channels += 1
                    return lane
            lane = _Lane(conn)
            lane.channels = 1
            lanes.append(lane)
            return lane

    def _chain(self, hops: tuple[Target, ...]) -> Any:
        """The open connection to the last of ``hops`` (None for no hops): one per prefix."""
        conn: Any = None
        for i in range(len(hops)):
            key: ChainKey = tuple(h.ident for h in hops[: i + 1])
            with self._lock:
                lock = self._locks.setdefault(key, threading.Lock())
            with lock:
                if key in self._failures:
                    raise Failed(self._failures[key])
                known = self._conns.get(key)
                if known is None or not known.is_connected:
                    known = self._conns[key] = self._hop(key, hops[: i + 1], conn)
                conn = known
        return conn

    def _hop(
        self, key: ChainKey, hops: tuple[Target, ...], before: Any, *, remember: bool = True
    ) -> Any:
        """A new connection to the last of ``hops``, through ``before`` (the one to the hop
        in front of it) or over TCP; its failure is named and (``remember``) kept for the
        run."""
        hop = hops[-1]
        limit = self._ctx.timeout_for(hop)
        make: Callable[[], Sock]
        command = hop.options.get("proxycommand")
        if before is None and command:  # the first hop's own ProxyCommand (hops._hop)
            expanded = expand(command, hop)
            make = lambda: _proxy(expanded)  # noqa: E731
        elif before is None:
            make = lambda: tcp(hop, limit)  # noqa: E731
        else:
            via = hops[-2]
            make = lambda: _socket(before, via, hop, limit)  # noqa: E731
        try:
            with dialing.via_hop():
                return open_connection(hop, self._ctx, make)
        except Failed as exc:
            failure = name_hop(exc.failure, hop)
            if remember:
                self._failures[key] = failure
            raise Failed(failure) from exc

    def close(self) -> None:
        with self._lock:
            lanes = [ln.conn for group in self._lanes.values() for ln in group]
            conns = list(self._conns.values())
            self._lanes.clear()
            self._conns.clear()
        # Last hops first: closing a bastion under a live inner connection cuts it mid-close.
        for conn in [*lanes, *reversed(conns)]:
            with contextlib.suppress(Exception):  # a hop that is already gone
                conn.close()


def _socket(conn: Any, via: Target, to: Target, limit: float) -> HopSocket:
    """A channel to an inner hop through ``conn``, as a socket; its failures as ``Failed``."""
    try:
        return HopSocket(channel(conn, via, to, limit))
    except _Refused as exc:
        raise Failed(exc.failure) from exc
    except _Lost as exc:
        raise Failed(TransportFailure(
            "unreachable", f"cannot connect to {to.where}: connection to {via.name} lost"
        )) from exc
