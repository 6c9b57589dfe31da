"""Stage type ``guard``: refuse the whole teardown while a file under ``path`` is open
for writing, or until ``wait_for_file`` has a line matching ``wait_for_line``.

Its refusal is a host-level ``error`` record, read by the parser's generic part.

>>> from fleetclean.engine.model import ResolvedStage
>>> STAGE.assignments(ResolvedStage("g", "guard", {
...     "path": "/dev/shm/hs", "wait_for_file": "", "wait_for_line": "", "timeout": 0.0}))
['opt_path=/dev/shm/hs', "opt_wait_for_file=''", "opt_wait_for_line=''", 'opt_timeout_ms=0']
"""

from __future__ import annotations

from fleetclean.engine.checks import abs_path, ere_or_empty, number
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q, seconds_ms


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    return [
        f"opt_path={q(o['path'])}",
        f"opt_wait_for_file={q(o['wait_for_file'])}",
        f"opt_wait_for_line={q(o['wait_for_line'])}",
        f"opt_timeout_ms={seconds_ms(o['timeout'])}",
    ]


STAGE = StageType(
    name="guard",
    options=(
        Option("path", abs_path, ""),
        Option("wait_for_file", abs_path, ""),
        Option("wait_for_line", ere_or_empty, ""),
        Option("timeout", number, 0),
    ),
    assignments=_assignments,
    template=packaged("guard.sh"),
)
