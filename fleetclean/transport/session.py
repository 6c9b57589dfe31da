"""One fleet run's transport: every host's connection, the hops they share, host keys.

``Session.run`` sends a script on standard input to bash (``boot``), streams stdout lines to a
callback, and returns what came back or *why nothing could* as a ``TransportFailure`` value
(never an exception), so one bad host never hides the others.

A session made with ``keep=True`` (``status --watch``) keeps each host's connection open
after its script for the next run: one handshake per host for the whole watch (at most
``keep_at_most`` of them, which the limits on open files and threads set:
``transport.limits``). A kept
connection that has dropped meanwhile is replaced, and so is one that turns out dead when
the next session channel is asked of it (nothing has run on the host then). Connections a
caller hands in (``adopt``, the library API's fabric ``Connection``s) are used the same way
and left as they were found: open if they were open, closed if the session opened them.

Example::

    with Session(Options(connect_timeout=5, timeout=60)) as session:
        out = session.run(host, "echo hi")
    out.ok           # True; out.stdout == "hi\\n"
    # a host with a changed key:
    out.failure.kind  # "host_key_mismatch"; nothing was run there
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from fleetclean.models import Host
from fleetclean.transport import dialing
from fleetclean.transport.base import (
    Failed,
    LineCallback,
    Options,
    Script,
    ScriptOutput,
    TransportFailure,
)
from fleetclean.transport.classify import Phase, Where, timed_out
from fleetclean.transport.connect import Context, open_connection, open_given
from fleetclean.transport.hops import Configs, Target, pace_key, resolve
from fleetclean.transport.hostkeys import KnownHostsCache
from fleetclean.transport.local import run_local
from fleetclean.transport.pool import Pool
from fleetclean.transport.stream import NoSession, open_script_channel, stream
from fleetclean.transport.upstream import idle, running

# paramiko logs a failed handshake from its reader thread ("Exception (client): Error
# reading SSH protocol banner" and a traceback); with no handler Python prints that on
# stderr. Every failure comes back as a TransportFailure value instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def target_of(host: Host) -> Target:
    return Target(host.name, host.address, host.port or 22, host.user, host.key,
                  host.ssh_options, host.identities)


class Session:
    """Shared state for one fleet run: host keys, parsed keys and configs, jump hosts."""

    def __init__(self, opts: Options, *, keep: bool = False,
                 keep_at_most: int | None = None) -> None:
        self.opts = opts
        self._ctx = Context(opts.connect_timeout, KnownHostsCache(opts.known_hosts),
                            opts.accept_new_host_keys)
        self._configs = Configs()
        self._pool = Pool(self._ctx)
        self._keep = keep
        # Kept connections hold a file and a thread each: no more than the limits leave
        # room for (transport.limits); the others log in again at each run.
        self._keep_at_most = keep_at_most
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self._kept: dict[str, Any] = {}
        self._given: dict[str, Any] = {}
        self._given_open: set[str] = set()  # given connections that were open already
        self.aborted = False

    def adopt(self, name: str, conn: Any) -> None:
        """Reach host ``name`` through ``conn``, a ``fabric.Connection`` the caller made."""
        with self._lock:
            self._given[name] = conn
            if conn.is_connected:
                self._given_open.add(name)

    def abort(self) -> None:
        """Close every open connection now (a second Ctrl-C): each host's read loop sees
        its channel closed and returns; sshd hangs up on the scripts."""
        with self._lock:
            self.aborted = True
            conns = list(self._open)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._pool.close()

    def close(self) -> None:
        with self._lock:
            conns = list(self._kept.values())
            conns += [c for n, c in self._given.items() if n not in self._given_open]
            self._kept.clear()
        for conn in conns:
            with contextlib.suppress(Exception):  # closing a connection a hop already lost
                conn.close()
        self._pool.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, host: Host) -> Any:
        """An open ``fabric.Connection`` to ``host`` along its hops; raises ``Failed``."""
        given = self._given.get(host.name)
        if given is not None:
            return open_given(given, self._ctx)
        target = target_of(host)
        route = resolve(target, host.proxy_jump,
                        self._configs.get(host.ssh_config, host.ssh_config_system))
        make_sock = self._pool.sock_maker(route, target)
        # Every host behind one ProxyCommand reaches the same sshd first (its bastion):
        # their new connections are paced together.
        pace = ("proxycommand", pace_key(route.proxy_command, target)) if (
            route.proxy_command) else None
        try:
            return open_connection(target, self._ctx, make_sock, pace)
        except Failed as exc:
            if route.proxy_command:
                raise Failed(TransportFailure(
                    exc.failure.kind, f"ProxyCommand '{route.proxy_command}': "
                    f"{exc.failure.message}")) from exc
            raise

    def _acquire(self, host: Host) -> tuple[Any, bool]:
        """(open connection, whether it was open already) for ``host``."""
        with self._lock:
            conn = self._kept.get(host.name) or self._given.get(host.name)
        if conn is not None and conn.is_connected:
            if host.name not in self._given:
                running(conn)
            dialing.note(Phase.CHANNEL.value)
            return conn, True
        return self.connect(host), False

    def _forget(self, host: Host, conn: Any) -> None:
        """Drop a kept connection that no longer works, and close it (a caller's own is
        left to the caller, as :meth:`_release` leaves it)."""
        with self._lock:
            self._open.discard(conn)
            if host.name in self._given:
                return
            if self._kept.get(host.name) is conn:
                del self._kept[host.name]
        with contextlib.suppress(Exception):
            conn.close()

    def _release(self, host: Host, conn: Any) -> None:
        """After a run: a caller's connection stays as it is, a kept one waits quietly for
        the next run (see ``upstream.idle``), any other is closed."""
        with self._lock:
            self._open.discard(conn)
            if host.name in self._given:
                return
            keep = self._keep and conn.is_connected and (
                self._keep_at_most is None or host.name in self._kept
                or len(self._kept) < self._keep_at_most)
            if keep:
                self._kept[host.name] = conn
            else:
                self._kept.pop(host.name, None)
        if keep:
            idle(conn)
        else:
            with contextlib.suppress(Exception):  # closing a connection a hop already lost
                conn.close()

    def run(self, host: Host, script: Script, on_line: LineCallback | None = None) -> ScriptOutput:
        """Run ``script`` on ``host``; failures come back as values."""
        if host.connection == "local":
            return run_local(host, script, self.opts, on_line)
        try:
            return self._run(host, script, on_line)
        finally:
            dialing.done()  # the steps noted on this thread were this host's

    def _run(self, host: Host, script: Script, on_line: LineCallback | None) -> ScriptOutput:
        try:
            conn, reused = self._acquire(host)
            out = self._run_on(conn, host, script, on_line)
            if reused and out.failure is not None and not out.started and (
                    not conn.is_connected or "session channel" in out.failure.message):
                # A kept connection that died unnoticed: nothing ran, so connect again. One
                # dropped silently (a firewall or NAT forgot it) still reads as connected:
                # its session channel never opens, and it was kept, dead, refresh after
                # refresh of a --watch until TCP gave up on it.
                self._forget(host, conn)
                conn = self.connect(host)
                out = self._run_on(conn, host, script, on_line)
        except Failed as exc:
            return ScriptOutput(failure=exc.failure)
        except Exception as exc:  # a bug or an odd error: this host's failure, not the run's
            return ScriptOutput(failure=TransportFailure(
                "error", f"{host.address}:{host.port or 22}: {type(exc).__name__}: {exc}"))
        self._release(host, conn)
        return out

    def _run_on(
        self, conn: Any, host: Host, script: Script, on_line: LineCallback | None
    ) -> ScriptOutput:
        with self._lock:
            self._open.add(conn)
        return self._script(conn, host, script, on_line)

    def _script(
        self, conn: Any, host: Host, script: Script, on_line: LineCallback | None
    ) -> ScriptOutput:
        where = f"{host.address}:{host.port or 22}"
        limit = self._ctx.timeout_for(target_of(host))
        started = time.monotonic()
        try:
            chan = open_script_channel(conn.client.get_transport(), host, script, limit)
        except Failed as exc:  # sudo did not start the script: nothing ran
            return ScriptOutput(failure=exc.failure)
        except NoSession as exc:
            if "timeout" in str(exc).lower() or time.monotonic() - started >= limit * 0.9:
                return ScriptOutput(failure=timed_out(
                    Where(host.address, host.port or 22), Phase.CHANNEL, limit))
            return ScriptOutput(failure=TransportFailure(
                "error", f"{where}: the server refused a session channel: {exc}"))
        except Exception as exc:
            return ScriptOutput(failure=TransportFailure(
                "error", f"{where}: {type(exc).__name__}: {exc}"), started=True)
        try:
            return stream(chan, host, self.opts.timeout, on_line)
        except Exception as exc:
            # Whatever breaks while the script runs (a socket error) is this host's failure,
            # never the whole run's.
            return ScriptOutput(failure=TransportFailure(
                "error", f"{where}: {type(exc).__name__}: {exc}"), started=True)
