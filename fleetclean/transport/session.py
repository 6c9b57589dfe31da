"""One fleet run's transport: every host's connection, the hops they share, host keys.

``Session.run`` sends a script on standard input to ``bash -s``, streams stdout lines to a
callback, and returns what came back or *why nothing could* as a ``TransportFailure`` value
(never an exception), so one bad host never hides the others.

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

import paramiko

from fleetclean.models import Host
from fleetclean.transport.base import Failed, LineCallback, Options, ScriptOutput, TransportFailure
from fleetclean.transport.classify import Phase, Where, timed_out
from fleetclean.transport.connect import Context, open_connection
from fleetclean.transport.hops import Configs, Target, resolve
from fleetclean.transport.hostkeys import KnownHostsCache
from fleetclean.transport.local import run_local
from fleetclean.transport.pool import Pool
from fleetclean.transport.stream import open_script_channel, stream

# paramiko logs a failed handshake from its reader thread ("Exception (client): Error
# reading SSH protocol banner" and a traceback); with no handler Python prints that on
# stderr. Every failure comes back as a TransportFailure value instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def target_of(host: Host) -> Target:
    return Target(host.name, host.address, host.port or 22, host.user, host.key,
                  host.ssh_options)


class Session:
    """Shared state for one fleet run: host keys, parsed keys and configs, jump hosts."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._ctx = Context(opts.connect_timeout, KnownHostsCache(opts.known_hosts),
                            opts.accept_new_host_keys)
        self._configs = Configs()
        self._pool = Pool(self._ctx)
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self.aborted = False

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
        self._pool.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, host: Host) -> Any:
        """An open ``fabric.Connection`` to ``host`` along its hops; raises ``Failed``."""
        target = target_of(host)
        route = resolve(target, host.proxy_jump, self._configs.get(host.ssh_config))
        make_sock = self._pool.sock_maker(route, target)
        try:
            return open_connection(target, self._ctx, make_sock)
        except Failed as exc:
            if route.proxy_command:
                raise Failed(TransportFailure(
                    exc.failure.kind, f"ProxyCommand '{route.proxy_command}': "
                    f"{exc.failure.message}")) from exc
            raise

    def run(self, host: Host, script: str, on_line: LineCallback | None = None) -> ScriptOutput:
        """Run ``script`` on ``host``; failures come back as values."""
        if host.connection == "local":
            return run_local(host, script, self.opts, on_line)
        where = f"{host.address}:{host.port or 22}"
        try:
            conn = self.connect(host)
        except Failed as exc:
            return ScriptOutput(failure=exc.failure)
        except Exception as exc:  # a bug or an odd error: this host's failure, not the run's
            return ScriptOutput(failure=TransportFailure(
                "error", f"{where}: {type(exc).__name__}: {exc}"))
        with self._lock:
            self._open.add(conn)
        try:
            return self._script(conn, host, script, on_line)
        finally:
            with self._lock:
                self._open.discard(conn)
            with contextlib.suppress(Exception):  # closing a connection a hop already lost
                conn.close()

    def _script(
        self, conn: Any, host: Host, script: str, on_line: LineCallback | None
    ) -> ScriptOutput:
        where = f"{host.address}:{host.port or 22}"
        limit = self._ctx.timeout_for(target_of(host))
        started = time.monotonic()
        try:
            chan = open_script_channel(conn.client.get_transport(), host, script, limit)
        except Failed as exc:  # sudo did not start the script: nothing ran
            return ScriptOutput(failure=exc.failure)
        except paramiko.SSHException as exc:
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
