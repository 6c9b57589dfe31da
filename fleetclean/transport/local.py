"""The local connection (``ansible_connection: local``): the script to ``boot.BASH -s``, as over SSH
with become (no login shell runs first: ``boot`` is for SSH).

>>> out = run_local(Host("here", "localhost", connection="local"), "echo hi", Options(), None)
>>> (out.stdout, out.exit_code)
('hi\\n', 0)
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import threading
import time

from fleetclean.models import Host
from fleetclean.transport import become
from fleetclean.transport.base import (
    LineCallback,
    LineSplitter,
    Options,
    Script,
    ScriptOutput,
    TransportFailure,
    script_bytes,
)


class _ProcessPipe:
    """The local ``sudo`` process as ``become.converse`` drives it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout and proc.stderr
        self.proc = proc
        self.err_fd = proc.stderr.fileno()
        self.open = [proc.stdout.fileno(), self.err_fd]
        self.err = bytearray()

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")

    def wait(self, timeout: float) -> None:
        if self.open:
            select.select(self.open, [], [], timeout)

    def drain(self) -> None:
        while self.open:
            ready, _, _ = select.select(self.open, [], [], 0)
            if not ready:
                return
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    self.open.remove(fd)
                elif fd == self.err_fd:
                    self.err += data

    def send(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def ended(self) -> bool:
        return self.proc.poll() is not None or not self.open

    def exit_code(self) -> int | None:
        return self.proc.poll()


def run_local(
    host: Host, script: Script, opts: Options, on_line: LineCallback | None,
    aborted: threading.Event | None = None,
) -> ScriptOutput:
    how = become.plan(host)
    argv = shlex.split(how.command)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return ScriptOutput(failure=TransportFailure("error", f"cannot run {argv[0]}: {exc}"))
    if how.becomes:
        failure = become.converse(_ProcessPipe(proc), host, how, "local", opts.connect_timeout)
        if failure is not None:
            proc.kill()  # our own child, by PID
            proc.wait()
            return ScriptOutput(failure=failure)
    lines = LineSplitter(on_line)
    out = bytearray()
    err_chunks: list[bytes] = []
    assert proc.stdin and proc.stdout and proc.stderr
    stderr_pipe = proc.stderr

    def drain_stderr() -> None:
        err_chunks.append(stderr_pipe.read())

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    for data in script_bytes(script):
        proc.stdin.write(data)
    proc.stdin.close()
    deadline = time.monotonic() + opts.timeout
    fd = proc.stdout.fileno()

    def cut(kind: str, message: str) -> ScriptOutput:
        """What the script said before the read stopped early, and why it stopped."""
        return ScriptOutput(out.decode("utf-8", "replace"),
                            b"".join(err_chunks).decode("utf-8", "replace"), None,
                            TransportFailure(kind, message), started=True)

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()  # our own child, by PID
            proc.wait()
            return cut("timeout", f"local script ran past --timeout {opts.timeout:g}s")
        if aborted is not None and aborted.is_set():
            # A second Ctrl-C: stop reading, as a closed SSH connection does. A teardown
            # then goes on alone and tells the next run (lib.sh: "the journal").
            with contextlib.suppress(OSError):
                proc.stdout.close()
            return cut("error", "fleetclean stopped reading (a second Ctrl-C)")
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            out += data
            lines.feed(data)
    code = proc.wait()
    reader.join()
    stderr = b"".join(err_chunks).decode("utf-8", "replace")
    return ScriptOutput(out.decode("utf-8", "replace"), stderr, code, None, started=True)


class LocalSession:
    """What ``fleet.run_fleet`` needs of a ``transport.session.Session`` when every host runs
    here (``-c local``, ``--local``): no fabric, paramiko or invoke is loaded (70 ms of
    imports, and a GPU machine with no sshd may not have them at all)."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.aborted = threading.Event()

    def run(
        self, host: Host, script: Script, on_line: LineCallback | None = None
    ) -> ScriptOutput:
        return run_local(host, script, self.opts, on_line, self.aborted)

    def abort(self) -> None:
        """Stop reading every script (a second Ctrl-C): each read loop sees it within 0.2 s
        and returns; the scripts are not killed (a teardown goes on alone)."""
        self.aborted.set()

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
