"""What a stage type declares: :class:`Option`, :class:`StageType`, and the
:class:`Readings` its record readers add to.

>>> from fleetclean.engine.checks import number
>>> opt = Option("grace", number, 10)
>>> opt.required, Option("pattern", text).required
(False, True)
>>> q("it's"), seconds_ms(2.5)
('\\'it\\'"\\'"\\'s\\'', '2500')
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from fleetclean.engine.checks import Check, text
from fleetclean.engine.model import Location, ResolvedStage
from fleetclean.models import GpuReset, Owner, ProcessRef, Signalled, StageResult

if TYPE_CHECKING:
    from importlib.abc import Traversable

REQUIRED: Any = object()
"""Marks an option that has no default."""

Resolver = Callable[[Any, Mapping[str, Any], Location, str, dict[str, str]], Any]
"""``resolver(raw, variables, where, what, env)``: an option's typed value from the value
as written; it may add ``FC_VAR_x`` values to ``env``. For options that substitution
followed by a check cannot express (a shell command, glob flags)."""


SMI_HUNG = 124
"""The exit status an ``nvsmi`` record gives for an nvidia-smi that did not answer within
``smi_timeout`` (lib.sh: fc_smi_hung; 124 is timeout(1)'s): its text is the node's own
sentence, which says whether SIGKILL could end it."""
SMI_HUNG_WORDS = ("nvidia-smi did not answer", "nvidia-smi not started")
"""How that sentence begins: a call of this run's did not answer (fc_smi_hung), or none was
started, an earlier run's still waiting in the driver (fc_smi_noted)."""


@dataclass(frozen=True)
class Option:
    """One option of a stage type: its name, its check, its default.

    ``check`` gets the value after ``{{ }}`` substitution; ``resolver``, when given,
    replaces substitution and check and gets the value as written.
    """

    name: str
    check: Check = text
    default: Any = REQUIRED
    resolver: Resolver | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass
class StageReading:
    """One stage as its records arrive."""

    name: str
    type: str
    changes: list[str] = field(default_factory=list)
    result: StageResult | None = None


@dataclass
class Readings:
    """One host's records read so far: the report under construction.

    The parser fills the generic part (begin, lock, stage, signal, change, end, error,
    done); a stage type's record readers add what their own records say.
    """

    began: bool = False
    done: bool = False
    busy: bool = False
    stages: dict[str, StageReading] = field(default_factory=dict)
    current: str | None = None  # the index of the stage running when output ended
    signalled: list[Signalled] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    gpu_lines: list[str] = field(default_factory=list)
    app_lines: list[str] = field(default_factory=list)
    # pid, device file, cmdline, GPU index (None: not known)
    holders: list[tuple[int, str, str, int | None]] = field(default_factory=list)
    verify: str | None = None
    verify_message: str = ""
    nvsmi: str | None = None
    nvsmi_exit: int | None = None
    verify_rule: str | None = None  # clean|leak|stuck|refused|respawn|deadline|error|skipped
    # pid -> (user, command line, why protected, "stuck" or "")
    procs: dict[int, tuple[str, str, str, str]] = field(default_factory=dict)
    # pid -> its start time (clock ticks after boot): with the PID, one process for its life
    starts: dict[int, int] = field(default_factory=dict)
    protected: dict[int, str] = field(default_factory=dict)  # holder pid -> why protected
    bare: dict[int, int] = field(default_factory=dict)  # GPU index -> MiB no process holds
    pages: dict[int, tuple[str, str]] = field(default_factory=dict)  # retired, remapped
    boot_epoch: int | None = None
    xids: list[tuple[int, str]] = field(default_factory=list)  # seconds since boot, line
    stuck: dict[int, str] = field(default_factory=dict)  # pid -> cmdline, state D after KILL
    left: list[ProcessRef] = field(default_factory=list)  # parents of killed holders, alive
    resets: list[GpuReset] = field(default_factory=list)  # gpu-reset's, one per GPU
    owners: dict[int, Owner] = field(default_factory=dict)
    judged_gpus: list[int] | None = None  # --gpus / an epilog's job: the GPUs judged
    refused: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # cmd, who, fix
    warnings: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # unheard runs' tokens ("unheard")


RecordReader = Callable[[Readings, list[str]], None]
"""``reader(readings, fields)``: fold one record's (decoded) fields into the readings."""


@dataclass(frozen=True)
class StageType:
    """Everything fleetclean knows about one stage type, declared in its own module.

    ``name`` is what a playbook writes as ``type:``; ``options`` its options in order;
    ``assignments`` turns a resolved stage into the ``opt_*=`` lines of ``fc_main``;
    ``template`` is its bash file (defining ``fc_stage_<name with - as _>``);
    ``records`` reads back the record kinds only this type writes; ``aliases`` maps old
    option spellings to their names; ``libraries`` names the packaged bash files beyond
    ``lib.sh`` its template calls into (``lib-kill.sh`` for the types that signal).
    """

    name: str
    options: tuple[Option, ...]
    assignments: Callable[[ResolvedStage], list[str]]
    template: Traversable
    records: Mapping[str, RecordReader] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    libraries: tuple[str, ...] = ()

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def defaults(self) -> dict[str, Any]:
        """Each option's default (:data:`REQUIRED` for those without one), in order."""
        return {o.name: o.default for o in self.options}


def q(value: str) -> str:
    """Shell-quote for bash: every substituted value goes through here."""
    return shlex.quote(value)


def seconds_ms(seconds: float) -> str:
    """Seconds as whole milliseconds, the unit bash's integer arithmetic compares."""
    return str(round(seconds * 1000))


def packaged(name: str) -> Traversable:
    """A template shipped beside the built-in stage types, e.g. ``packaged("signal.sh")``."""
    return resources.files("fleetclean.engine.stages") / name
