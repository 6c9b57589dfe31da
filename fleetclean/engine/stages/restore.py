"""Stage type ``restore``: put ``file`` back from ``file`` + ``backup_suffix``.

>>> from fleetclean.engine.model import ResolvedStage
>>> STAGE.assignments(ResolvedStage("r", "restore", {
...     "file": "/opt/m.py", "backup_suffix": ".bak"}))
['opt_file=/opt/m.py', 'opt_backup_suffix=.bak']
"""

from __future__ import annotations

from fleetclean.engine.checks import abs_path, suffix
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    return [f"opt_file={q(o['file'])}", f"opt_backup_suffix={q(o['backup_suffix'])}"]


STAGE = StageType(
    name="restore",
    options=(Option("file", abs_path), Option("backup_suffix", suffix, ".bak_hsdump")),
    assignments=_assignments,
    template=packaged("restore.sh"),
)
