"""The streaming loop: the script to bash on a session channel, stdout back line by line.

fleetclean keeps this loop instead of fabric's ``Connection.run``: invoke's runner starts up to
three IO threads per command that poll every 10 ms, so at a few hundred hosts the controller
spends its CPU waking threads. One blocking ``recv`` per host on the channel of the fabric
connection's transport (``conn.client.get_transport()``) wakes when bytes arrive (or every
``WAKE_S`` to see the exit status), and needs no thread beyond the host's own worker.
"""

from __future__ import annotations

import time

from fleetclean.models import Host
from fleetclean.transport import become, boot
from fleetclean.transport.base import (
    Failed,
    LineCallback,
    LineSplitter,
    Script,
    ScriptOutput,
    TransportFailure,
    script_bytes,
)
from fleetclean.transport.sshlib import paramiko

# How long a finished script's channel may stay open (a background process holding it)
# before the run stops reading.
EOF_GRACE_S = 2.0
# The longest the loop sleeps without data, to see an exit status that comes without EOF
# (a background process holding stdout): it then waits EOF_GRACE_S more. The deadline needs
# no wake (each wait ends at it) and EOF wakes the read at once. A wake costs ~40 us of CPU
# (paramiko's timed-out read raising and catching its timeout) for every host in flight: at
# 0.25 s, a post-extraction at 128 hosts read 13 times a host, against 5 for a status.
WAKE_S = 1.0


class NoSession(Exception):
    """The session channel could not be opened: nothing was started on the host."""


def open_script_channel(
    transport: paramiko.Transport, host: Host, script: Script, limit: float
) -> paramiko.Channel:
    """The session channel (opened within ``limit``) with bash reading the script: the one
    command run on the host (``become.plan``; ``boot.command`` without become: the script
    itself comes on stdin, so no pattern of it is ever in a process's argv; the seeds'
    pkill killed its own shell that way; only a status's GPU read starts in the command).
    With become, sudo's dialogue comes first, within ``limit`` too.

    Raises ``NoSession`` (its cause the transport's error) when the channel itself cannot be
    opened, and ``Failed`` when sudo does not start the script: nothing has run then. Any
    later error may leave the script started."""
    try:
        chan = transport.open_session(timeout=limit)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise NoSession(str(exc)) from exc
    # Its size only: the bytes are made again as they are sent (become's dialogue may take
    # a while, and a copy per host in flight is what the shared pieces avoid).
    if host.become:  # sudo's `bash -s` (become.plan): the script's own lines start its reads
        how = become.plan(host)
    else:
        head = script if isinstance(script, str) else next(iter(script), "")
        how = become.plan(host, start=boot.command(sum(map(len, script_bytes(script))),
                                                   boot.first_read(head)))
    chan.exec_command(how.command)
    if how.becomes:
        where = f"{host.address}:{host.port or 22}"
        failure = become.converse(_ChannelPipe(chan), host, how, where, limit)
        if failure is not None:
            chan.close()
            raise Failed(failure)
    for data in script_bytes(script):
        chan.sendall(data)
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
        # A short poll rather than select(): select() on a paramiko channel makes it open a
        # pipe (two descriptors) and write to it on every packet for the channel's life.
        time.sleep(min(timeout, 0.01))

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
        # Before an exit status, a wake; after one, what is left of EOF's grace.
        wait = WAKE_S if status_at is None else EOF_GRACE_S - (time.monotonic() - status_at)
        at_eof = reader.read(max(0.0, min(left, wait)))
        if not at_eof and chan.exit_status_ready():
            # A process the script left in the background can hold stdout open for ever:
            # after the status, EOF gets a few seconds, not the whole --timeout.
            status_at = status_at or time.monotonic()
            if time.monotonic() - status_at >= EOF_GRACE_S:
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
        "the connection was closed (a teardown goes on there alone, and the host's next "
        "run says how it ended)",
    ), started=True)


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
