"""The streaming loop: the script to ``bash -s`` on a session channel, stdout back line by line.

fleetclean keeps this loop instead of fabric's ``Connection.run``: invoke's runner starts up to
three IO threads per command that poll every 10 ms, so at a few hundred hosts the controller
spends its CPU waking threads. One blocking ``recv`` per host on the channel of the fabric
connection's transport (``conn.client.get_transport()``) wakes when bytes arrive (or every
``WAKE_S`` to see the exit status), and needs no thread beyond the host's own worker.

>>> remote_command(Host("h", "h", become=True))
'sudo -n -u root -- bash -s'
>>> seen = []
>>> lines = LineSplitter(seen.append)
>>> lines.feed(b"one\\ntw"); lines.feed(b"o\\n"); seen
['one', 'two']
"""

from __future__ import annotations

import shlex
import time

import paramiko

from fleetclean.models import Host
from fleetclean.transport.base import LineCallback, ScriptOutput, TransportFailure

# How long a finished script's channel may stay open (a background process holding it)
# before the run stops reading.
EOF_GRACE_S = 2.0
WAKE_S = 0.25  # the longest the loop sleeps without data: to see the exit status, the end


def remote_command(host: Host) -> str:
    """The one command run on the host; the script itself comes on stdin, so no pattern of
    it is ever in a process's argv (the seeds' pkill killed its own shell that way)."""
    if host.become:
        user = shlex.quote(host.become_user or "root")
        return f"sudo -n -u {user} -- bash -s"
    return "bash -s"


_SUDO_PASSWORD = ("a password is required", "a terminal is required")


def sudo_failure(stderr: str, host: Host) -> TransportFailure | None:
    if host.become and any(s in stderr for s in _SUDO_PASSWORD):
        return TransportFailure(
            "auth_failed",
            f"sudo on {host.name} wants a password; allow passwordless sudo for bash "
            "(NOPASSWD) or connect as root (ansible_user: root, ansible_become: false)",
        )
    return None


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


class NoSession(Exception):
    """The session channel could not be opened: nothing was started on the host."""


def open_script_channel(
    transport: paramiko.Transport, host: Host, script: str, limit: float
) -> paramiko.Channel:
    """The session channel (opened within ``limit``) with ``bash -s`` reading the script.

    Raises ``NoSession`` (its cause the transport's error) when the channel itself cannot be
    opened, so a caller knows nothing ran; any later error may leave the script started."""
    try:
        chan = transport.open_session(timeout=limit)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise NoSession(str(exc)) from exc
    chan.exec_command(remote_command(host))
    chan.sendall(script.encode())
    chan.shutdown_write()
    return chan


class _Reader:
    """Reads one channel: stdout line by line to the callback, and stderr.

    A blocking ``recv`` wakes as soon as stdout data (or EOF) arrives; ``select()`` on a
    paramiko channel would make it open a pipe (two more descriptors per host) and write to
    it on every packet."""

    def __init__(self, chan: paramiko.Channel, on_line: LineCallback | None) -> None:
        self.chan = chan
        self.out, self.err = bytearray(), bytearray()
        self.lines = LineSplitter(on_line)

    def read(self, wait: float) -> bool:
        """Take what has come within ``wait`` seconds; True once stdout is at EOF."""
        self.chan.settimeout(wait)
        try:
            data = self.chan.recv(65536)
        except TimeoutError:  # socket.timeout: nothing yet
            data = None
        while data:
            self.out += data
            self.lines.feed(data)
            data = self.chan.recv(65536) if self.chan.recv_ready() else None
        while self.chan.recv_stderr_ready():
            self.err += self.chan.recv_stderr(65536)
        return data == b""

    def text(self) -> tuple[str, str]:
        return self.out.decode("utf-8", "replace"), self.err.decode("utf-8", "replace")


def stream(
    chan: paramiko.Channel, host: Host, timeout: float, on_line: LineCallback | None
) -> ScriptOutput:
    """Read ``chan`` until the script's exit status and EOF, or until ``timeout``."""
    reader = _Reader(chan, on_line)
    deadline = time.monotonic() + timeout
    status_at: float | None = None
    at_eof = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return _timed_out(chan, reader, host, timeout)
        if at_eof:
            # All output is in; the exit status follows (or the channel closes): sshd may
            # send EOF before the status, and the status before the last lines (seen under
            # load as output cut off in the middle of the verification).
            if chan.status_event.wait(min(left, WAKE_S)):
                break
            continue
        at_eof = reader.read(min(left, WAKE_S))
        if not at_eof and chan.exit_status_ready():
            # A process the script left in the background can hold stdout open for ever:
            # after the status, EOF gets a few seconds, not the whole --timeout.
            status_at = status_at or time.monotonic()
            if time.monotonic() - status_at > EOF_GRACE_S:
                break
    return _finish(chan, reader, host)


def _timed_out(
    chan: paramiko.Channel, reader: _Reader, host: Host, timeout: float
) -> ScriptOutput:
    chan.close()
    stdout, stderr = reader.text()
    return ScriptOutput(stdout, stderr, None, TransportFailure(
        "timeout",
        f"script still running on {host.name} after --timeout {timeout:g}s; "
        "the connection was closed and the host may be half-cleaned",
    ), started=True)


def _finish(chan: paramiko.Channel, reader: _Reader, host: Host) -> ScriptOutput:
    # A channel closed without an exit status reads -1 (bash killed, the connection
    # dropped); the parser then says which stage the output ended in.
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    stdout, stderr = reader.text()
    failure = sudo_failure(stderr, host)
    if code is None and failure is None:
        failure = TransportFailure(
            "error", f"connection to {host.name} was cut while the script ran"
        )
    return ScriptOutput(stdout, stderr, code, failure, started=True)
