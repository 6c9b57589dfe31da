"""One root exception, one subclass per stage of the pipeline, and the exit statuses.

Every error a user can cause is a ``FleetcleanError`` carrying a one-line message that names
the file, line and fix; ``cli`` turns it into that line on stderr and exit status 4.
``ExitStatus`` lives here, not in ``models``, so that ``--version``, ``--help`` and a bad
option never build the pipeline's dataclasses.
"""

from __future__ import annotations

import enum
import errno


class ExitStatus(enum.IntEnum):
    """Process exit statuses of the CLI contract."""

    OK = 0
    DIRTY = 1
    FAILED = 2
    INTERNAL = 3  # a bug in fleetclean: --debug prints its traceback
    BAD_INPUT = 4
    INTERRUPTED = 130


# What a write to a full file system (or to a file past its limits) fails with: the output
# of a command under `> file`, a failure to report in one line, not a bug.
WRITE_FAILED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class FleetcleanError(Exception):
    """Root of every error fleetclean raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        self.hint = hint

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = self.path
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"


class BadInput(FleetcleanError):
    """Bad input from the user: nothing is sent to any host; exit status 4."""


class InventoryError(BadInput):
    """The inventory file or --limit is wrong."""


class PlaybookError(BadInput):
    """The playbook file is wrong."""


class VariableError(BadInput):
    """A variable (-e, inventory, playbook default) is wrong or undefined."""


class UsageError(BadInput):
    """A command-line option is wrong."""


class SimError(FleetcleanError):
    """The simulated fleet could not be started, driven or stopped."""
