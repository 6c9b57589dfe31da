"""The transport's values: run options, what a run gave back, and why one failed.

Cheap to import (no paramiko, no fabric): the CLI builds ``Options`` before it knows whether
any host needs SSH.

>>> out = ScriptOutput(failure=TransportFailure("timeout", "no SSH banner within 5s"))
>>> (out.ok, out.started, out.failure.kind)
(False, False, 'timeout')
>>> ScriptOutput("hi\\n", exit_code=0).ok
True
>>> seen = []
>>> lines = LineSplitter(seen.append)
>>> lines.feed(b"one\\ntw"); lines.feed(b"o\\n"); seen
['one', 'two']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

LineCallback = Callable[[str], None]
Script = str | Sequence[str]
"""A script's text, or its pieces in order (``fleet.Job``: pieces shared between hosts)."""


def script_bytes(script: Script) -> Iterator[bytes]:
    """The script's bytes, a piece at a time: a shared piece is never joined into one
    copy per host.

    >>> list(script_bytes("echo hi\\n")), list(script_bytes(("echo ", "hi\\n")))
    ([b'echo hi\\n'], [b'echo ', b'hi\\n'])
    """
    for piece in (script,) if isinstance(script, str) else script:
        yield piece.encode()


@dataclass(frozen=True)
class Options:
    connect_timeout: float = 10.0
    timeout: float = 300.0
    known_hosts: tuple[str, ...] = ()  # extra files, checked besides the host's own
    accept_new_host_keys: bool = False


@dataclass(frozen=True)
class TransportFailure:
    """Why a script did not run (or did not finish) on a host.

    kind is one of the host statuses: unreachable, auth_failed, host_key_mismatch,
    timeout, error.
    """

    kind: str
    message: str


@dataclass(frozen=True)
class ScriptOutput:
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    failure: TransportFailure | None = None
    # True when the script started on the host: a failure after that (a timeout, a cut
    # connection) leaves its end unknown here (a teardown goes on alone: lib.sh's journal),
    # and the report must say so.
    started: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


class Failed(Exception):
    """Carries a TransportFailure out of the connection code to ``Session.run``."""

    def __init__(self, failure: TransportFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


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
