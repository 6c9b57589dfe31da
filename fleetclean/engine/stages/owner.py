"""Owner attribution (``owner.sh``): who runs each process a stage matches or signals or
the verification names; acting through the owner (``owner-act.sh``).

Not a stage type, but declared the same way so that the parser loops over it without
naming it: the records only these libraries write, ``owner PID KIND ID NAME`` (once per
PID, before the stage acts), ``refused IDX PID CMDLINE WHO FIX`` (a target left to its
owner) and ``warn IDX TEXT`` (an owner that may start again what was signalled).

>>> from fleetclean.engine.stages.base import Readings
>>> r = Readings()
>>> OWNER.records["owner"](r, ["41", "docker", "3f2a" * 16, "3f2a3f2a3f2a"])
>>> r.owners[41].kind, r.owners[41].name
('docker', '3f2a3f2a3f2a')
>>> OWNER.records["owner"](r, ["42", "who-knows", "", ""])
>>> r.owners[42]
Owner(kind='plain', id='', name='')
>>> OWNER.records["refused"](r, ["2", "41", "python3 x", "pod ml/llm-0",
...                              "kubectl delete pod -n ml llm-0"])
>>> r.refused[41][1]
'pod ml/llm-0'
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


def _refused(r: Readings, a: list[str]) -> None:
    # Every stage that matches it refuses it again: one entry per PID.
    r.refused.setdefault(int(a[1]), (a[2], a[3], a[4]))


def _warn(r: Readings, a: list[str]) -> None:
    if a[1] not in r.warnings:
        r.warnings.append(a[1])


OWNER = StageType(
    name="owner",
    options=(),
    assignments=_no_options,
    template=packaged("owner.sh"),
    records={"owner": _owner, "refused": _refused, "warn": _warn},
)
