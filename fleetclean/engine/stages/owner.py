"""Owner attribution (``owner.sh``): who runs each process a stage matches or signals.

Not a stage type, but declared the same way so that the renderer and the parser loop over
it without naming it: its template, included in every script right after ``lib.sh``, and
the record only it writes, ``owner PID KIND ID NAME`` (once per PID, before the stage acts).

>>> from fleetclean.engine.stages.base import Readings
>>> r = Readings()
>>> OWNER.records["owner"](r, ["41", "docker", "3f2a" * 16, "3f2a3f2a3f2a"])
>>> r.owners[41].kind, r.owners[41].name
('docker', '3f2a3f2a3f2a')
>>> OWNER.records["owner"](r, ["42", "who-knows", "", ""])
>>> r.owners[42]
Owner(kind='plain', id='', name='')
"""

from __future__ import annotations

from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Readings, StageType, packaged
from fleetclean.models import OWNER_KINDS, Owner, OwnerKind


def _no_options(stage: ResolvedStage) -> list[str]:
    return []


def _owner(r: Readings, a: list[str]) -> None:
    # A kind this parser does not know (a newer script) reads as plain: never a guess.
    kind: OwnerKind = a[1] if a[1] in OWNER_KINDS else "plain"
    r.owners[int(a[0])] = Owner(kind, a[2], a[3]) if kind != "plain" else Owner("plain")


OWNER = StageType(
    name="owner",
    options=(),
    assignments=_no_options,
    template=packaged("owner.sh"),
    records={"owner": _owner},
)
