"""The registry of stage types: one module per type, beside its ``.sh`` template.

The playbook loader (which options a stage may have, their defaults), the variable
resolver (each option's check), the renderer (``opt_*`` assignments, templates) and the
parser (records only a type writes) all loop over :data:`STAGE_TYPES`; none of them
names a stage type.

>>> sorted(STAGE_TYPES)
['gpu-holders', 'gpu-reset', 'guard', 'remove', 'restore', 'shell', 'signal', 'slurm-job']
>>> stage_type("signal").defaults()["grace"]
10
>>> stage_type("sleep")
Traceback (most recent call last):
KeyError: "no stage type 'sleep'"

Adding a stage type
-------------------
A stage type is one Python module plus one bash file, registered below. ``gpu-reset`` is
the smallest complete example (``fleetclean/engine/stages/gpu_reset.py`` beside
``gpu-reset.sh``); its shape::

    from fleetclean.engine.checks import boolean, number
    from fleetclean.engine.stages.base import Option, Readings, StageType, packaged, q

    def _assignments(stage):                      # resolved options -> fc_main's lines
        return [f"opt_enabled={int(stage.options['enabled'])}", ...]

    def _reset(readings: Readings, fields: list[str]) -> None:   # "reset IDX GPU ..."
        readings.stages[fields[0]].changes.append(f"GPU{fields[1]} reset: {fields[2]}")

    STAGE = StageType(
        name="gpu-reset",                        # what a playbook writes as `type:`
        options=(Option("enabled", boolean, True),   # name, check, default (none:
                 Option("quiet", number, 1.0)),      # required)
        assignments=_assignments,
        template=packaged("gpu-reset.sh"),       # defines fc_stage_gpu_reset
        records={"reset": _reset},               # records only this type writes
    )

``gpu-reset.sh`` defines ``fc_stage_gpu_reset``, reads its ``$opt_*`` values, sets
``FC_STATUS``/``FC_MATCHED``/``FC_MESSAGE`` and writes its records with
``fc_rec reset "$FC_IDX" ...``. Add the module to :data:`_BUILT_IN` below, the template
is packaged with the others, and a test renders, runs and parses it
(``tests/engine/test_engine_stage_types.py`` does that for a toy type registered from
a test module with :func:`register`).
"""

from __future__ import annotations

from importlib import resources

from fleetclean.engine.stages import (
    gpu_holders,
    gpu_reset,
    guard,
    remove,
    restore,
    shell,
    signal,
    slurm_job,
)
from fleetclean.engine.stages.base import RecordReader, StageType
from fleetclean.engine.stages.owner import OWNER
from fleetclean.engine.stages.verify import VERIFY

GENERIC_RECORDS = ("begin", "lock", "stage", "match", "signal", "stuck", "unstuck", "change",
                   "end", "error", "left", "done", "scope", "clock", "journal", "unheard")
"""Record kinds the runtime writes whatever the stages (``lib.sh``; ``scope.sh``'s scope,
``standalone.sh``'s clock); the parser reads them itself. (A journal's own ``journaled``
and ``gone`` lines never reach the parser but inside a ``journal``: results/journal.py.)"""

_BUILT_IN = (signal, gpu_holders, gpu_reset, restore, remove, guard, shell, slurm_job)

STAGE_TYPES: dict[str, StageType] = {}
"""Every registered stage type by the name a playbook gives as ``type:``."""


def register(new: StageType) -> StageType:
    """Add a stage type; its name and its record kinds must be new.

    >>> register(stage_type("signal"))
    Traceback (most recent call last):
    ValueError: stage type 'signal' is already registered
    """
    if new.name in STAGE_TYPES:
        raise ValueError(f"stage type '{new.name}' is already registered")
    taken = set(GENERIC_RECORDS) | set(record_readers())
    clash = sorted(taken & set(new.records))
    if clash:
        raise ValueError(f"stage type '{new.name}': record kinds {clash} are taken")
    STAGE_TYPES[new.name] = new
    return new


def unregister(name: str) -> None:
    """Remove a stage type (a test's toy type, once the test is done)."""
    del STAGE_TYPES[name]


def stage_type(name: str) -> StageType:
    """The registered stage type called ``name``; KeyError if there is none."""
    try:
        return STAGE_TYPES[name]
    except KeyError:
        raise KeyError(f"no stage type '{name}'") from None


def record_readers() -> dict[str, RecordReader]:
    """Every stage-specific record kind (the verification's and owner attribution's
    included) with its reader."""
    readers: dict[str, RecordReader] = {**VERIFY.records, **OWNER.records}
    for stype in STAGE_TYPES.values():
        readers.update(stype.records)
    return readers


def template(name: str) -> str:
    """The text of one packaged bash file, e.g. ``template("lib.sh")``."""
    return (resources.files(__name__) / name).read_text(encoding="utf-8")


for _module in _BUILT_IN:
    register(_module.STAGE)
