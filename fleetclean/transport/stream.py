"""The streaming loop: the script to ``bash -s`` on a session channel, stdout back line by line.

fleetclean keeps this loop instead of fabric's ``Connection.run``: invoke's runner starts up to
three IO threads per command that poll every 10 ms, so at a few hundred hosts the controller
spends its CPU waking threads. One ``select()`` per host on the channel of the fabric
connection's transport (``conn.client.get_transport()``) wakes only when bytes or the exit
status arrive, and needs no thread beyond the host's own worker.

>>> seen = []
>>> lines = LineSplitter(seen.append)
>>> lines.feed(b"one\\ntw"); lines.feed(b"o\\n"); seen
['one', 'two']
"""

from __future__ import annotations

import select
import time

import paramiko

from fleetclean.models import Host
from fleetclean.transport import become
from fleetclean.transport.base import Failed, LineCallback, ScriptOutput, TransportFailure

# How long a finished script's channel may stay open (a background process holding it)
# before the run stops reading.
EOF_GRACE_S = 2.0


class LineSplitter:
    """Feeds complete stdout lines to a callback as bytes arrive."""

    def __init__(self, cb: LineCallback | None) -> None:
        self._cb = cb
        self._buf = b""

    def feed(self, data: bytes) -> None:
        if self._cb is None:
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._cb(line.decode("utf-8", "replace"))


def open_script_channel(
    transport: paramiko.Transport, host: Host, script: str, limit: float
) -> paramiko.Channel:
    """The session channel (opened within ``limit``) with ``bash -s`` reading the script:
    the one command run on the host (``become.plan``: the script itself comes on stdin, so
    no pattern of it is ever in a process's argv; the seeds' pkill killed its own shell that
    way). With become, sudo's dialogue comes first, within ``limit`` too; raises ``Failed``
    when sudo does not start the script (nothing has run then)."""
    chan = transport.open_session(timeout=limit)
    how = become.plan(host)
    chan.exec_command(how.command)
    if how.becomes:
        where = f"{host.address}:{host.port or 22}"
        failure = become.converse(_ChannelPipe(chan), host, how, where, limit)
        if failure is not None:
            chan.close()
            raise Failed(failure)
    chan.sendall(script.encode())
    chan.shutdown_write()
    return chan


class _ChannelPipe:
    """An SSH channel as ``become.converse`` drives it."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan
        self.err = bytearray()

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")

    def wait(self, timeout: float) -> None:
        select.select([self.chan], [], [], timeout)

    def drain(self) -> None:
        while self.chan.recv_ready():
            self.chan.recv(65536)  # a login shell's chatter: the script has not started
        while self.chan.recv_stderr_ready():
            self.err += self.chan.recv_stderr(65536)

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def ended(self) -> bool:
        return bool(self.chan.exit_status_ready() or self.chan.closed or self.chan.eof_received)

    def exit_code(self) -> int | None:
        return self.chan.recv_exit_status() if self.chan.exit_status_ready() else None


class _Reader:
    """Drains one channel's stdout (line by line to the callback) and stderr."""

    def __init__(self, chan: paramiko.Channel, on_line: LineCallback | None) -> None:
        self.chan = chan
        self.out, self.err = bytearray(), bytearray()
        self.lines = LineSplitter(on_line)

    def drain(self) -> bool:
        got = False
        while self.chan.recv_ready():
            data = self.chan.recv(65536)
            self.out += data
            self.lines.feed(data)
            got = True
        while self.chan.recv_stderr_ready():
            self.err += self.chan.recv_stderr(65536)
            got = True
        return got

    def text(self) -> tuple[str, str]:
        return self.out.decode("utf-8", "replace"), self.err.decode("utf-8", "replace")


def stream(
    chan: paramiko.Channel, host: Host, timeout: float, on_line: LineCallback | None
) -> ScriptOutput:
    """Read ``chan`` until the script's exit status and EOF, or until ``timeout``."""
    reader = _Reader(chan, on_line)
    deadline = time.monotonic() + timeout
    status_at: float | None = None
    # select() on the channel wakes us as soon as data or the exit status arrives, instead of
    # polling with sleeps (a teardown is often over in well under a second).
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            chan.close()
            stdout, stderr = reader.text()
            return ScriptOutput(stdout, stderr, None, TransportFailure(
                "timeout",
                f"script still running on {host.name} after --timeout {timeout:g}s; "
                "the connection was closed and the host may be half-cleaned",
            ), started=True)
        select.select([chan], [], [], min(left, 1.0))
        got = reader.drain()
        # Done once sshd has sent EOF as well as the exit status: it may send the status
        # while the script's last lines are still on their way (seen under load as output
        # cut off in the middle of the verification). A process the script left in the
        # background can hold the channel open for ever, so EOF gets a few seconds, not
        # the whole --timeout.
        drained = not chan.recv_ready() and not chan.recv_stderr_ready()
        if chan.exit_status_ready() and status_at is None:
            status_at = time.monotonic()
        if drained and status_at is not None and (
            chan.eof_received or chan.closed or time.monotonic() - status_at > EOF_GRACE_S
        ):
            break
        if not got and chan.closed:
            break
        if (status_at is not None or chan.eof_received) and not got:
            # After EOF paramiko's pipe stays readable: wait on time, not on select().
            time.sleep(0.005)
    return _finish(chan, reader, host)


def _finish(chan: paramiko.Channel, reader: _Reader, host: Host) -> ScriptOutput:
    # A channel closed without an exit status reads -1 (bash killed, the connection
    # dropped); the parser then says which stage the output ended in.
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    stdout, stderr = reader.text()
    failure = None
    if code is None:
        failure = TransportFailure(
            "error", f"connection to {host.name} was cut while the script ran"
        )
    return ScriptOutput(stdout, stderr, code, failure, started=True)
