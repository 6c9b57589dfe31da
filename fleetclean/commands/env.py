"""The streams and environment one invocation uses (tests pass their own), and the one
way an error line is written."""

from __future__ import annotations

import errno
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

# Wide enough for any table; rich lays a table out at its natural width, never wider.
_UNWRAPPED = 100_000


@dataclass
class Env:
    """The streams and environment one invocation uses; tests pass their own."""

    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    no_color: bool = False
    # The process's own command line (the ``fleetclean`` program, not ``main()`` called
    # from Python, as the tests do): only then may a command start the process again.
    own_process: bool = False

    def may_be_terminal(self, *, stderr: bool = False) -> bool:
        """Whether rich may draw on the stream as on a terminal, asked without importing
        rich (its console has the last word): rich's own rules from the environment first
        (``TTY_COMPATIBLE`` 0 or 1, then https://force-color.org), else the stream's."""
        forced = self.environ.get("TTY_COMPATIBLE", "")
        if forced in ("0", "1"):
            return forced == "1"
        if "FORCE_COLOR" in self.environ:
            return self.environ["FORCE_COLOR"] != ""
        return _isatty(self.stderr if stderr else self.stdout)

    def console(self, *, stderr: bool = False) -> Console:
        stream = self.stderr if stderr else self.stdout
        # https://no-color.org: set and not empty.
        no_color = self.no_color or bool(self.environ.get("NO_COLOR"))
        kind = _console_kind()
        if _isatty(stream):
            return kind(file=stream, no_color=no_color, highlight=False, soft_wrap=False)
        # Logs and pipes (CI, `| tee`): nothing is hard-wrapped; a table is as wide as it
        # needs unless COLUMNS says otherwise, and lines of text are never broken.
        return kind(file=stream, no_color=no_color, highlight=False, soft_wrap=True,
                    width=_columns(self.environ))

    @property
    def debug(self) -> bool:
        return self.environ.get("FLEETCLEAN_DEBUG", "") not in ("", "0")


@functools.cache
def _console_kind() -> type[Console]:
    """rich's Console, but for a reader that went away (``fleetclean status | head -1``).

    rich ends the whole process there: its ``on_broken_pipe`` raises ``SystemExit(1)``
    (https://github.com/Textualize/rich/pull/3468, for
    https://github.com/Textualize/rich/issues/1591), and 1 is fleetclean's "a host is
    dirty": a status of a clean fleet piped into ``head`` said dirty. Here the broken pipe
    goes back to the caller as the error it is; ``commands.output.emit`` keeps the exit
    status the hosts gave. (Made at the first console: rich is imported only then.)
    """
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is drawn for a reader that is gone
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return PipedConsole


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream is no terminal
        return False


def _columns(environ: dict[str, str]) -> int:
    value = environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else _UNWRAPPED


def error_line(env: Env, text: str) -> None:
    # Plain write, never wrapped: scripts grep this one line. Its control characters are
    # escaped: it can hold what a host sent (a login node's error, a certificate's words).
    from fleetclean.results.words import printable

    env.stderr.write(printable(" ".join(text.split())) + "\n")
    env.stderr.flush()
