"""The engine's frozen values: a parsed :class:`Playbook`; per host, a
:class:`ResolvedPlaybook`.

``load_playbook`` makes a Playbook (values as written, ``{{ var }}`` unresolved);
``resolve`` makes a ResolvedPlaybook (every value substituted and type-checked) that
``render_script`` turns into bash without resolving anything itself.

>>> Location("pb.yaml", 3, 5)
Location(path='pb.yaml', line=3, column=5)
>>> bool(VAR_NAME.match("dump_dir")), bool(VAR_NAME.match("dump-dir"))
(True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A variable name: what ``{{ name }}``, ``vars:`` and ``-e NAME=`` accept."""


@dataclass(frozen=True)
class Location:
    """Where a value was written: 1-based line and column."""

    path: str
    line: int
    column: int


@dataclass(frozen=True)
class Stage:
    """One stage: its type and every option (defaults filled in, ``{{ }}`` unresolved)."""

    name: str
    type: str
    options: dict[str, Any]
    where: Location
    option_where: dict[str, Location] = field(default_factory=dict)


@dataclass(frozen=True)
class Verify:
    """The verification's options (``max_used_mib``, ``timeout``, ``interval``, ``settle``)."""

    options: dict[str, Any]
    where: Location
    option_where: dict[str, Location] = field(default_factory=dict)


@dataclass(frozen=True)
class Playbook:
    """A parsed playbook. ``read_only`` playbooks always render in check mode."""

    name: str
    description: str
    path: str
    vars: dict[str, Any]
    stages: tuple[Stage, ...]
    verify: Verify | None
    var_where: dict[str, Location] = field(default_factory=dict)
    read_only: bool = False
    builtin: bool = False


@dataclass(frozen=True)
class ResolvedStage:
    """A stage whose options are substituted and type-checked, ready to render."""

    name: str
    type: str
    options: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # shell stage: FC_VAR_x -> value


# The built-in smi_timeout, in seconds (variables.BUILTIN_VARS, ResolvedPlaybook).
SMI_TIMEOUT_S = 30  # an int: the script's header lists the variables as given (30, not 30.0)


@dataclass(frozen=True)
class ResolvedPlaybook:
    """One host's playbook, resolved once: everything the renderer needs and nothing more.

    ``variables`` are the effective variables (shown in the script's header comment);
    ``verify`` is the verification as a stage of type ``verify``, or None.
    """

    name: str
    path: str
    builtin: bool
    read_only: bool
    stages: tuple[ResolvedStage, ...]
    verify: ResolvedStage | None
    protect: tuple[str, ...]
    lock_wait: float
    force: bool
    # Seconds each nvidia-smi call is waited for (lib.sh: fc_smi): one that does not
    # answer leaves the host faulty, its driver hung.
    smi_timeout: float = SMI_TIMEOUT_S
    variables: dict[str, Any] = field(default_factory=dict)
    # What a stage does to a target, per owner kind, and the units never stopped
    # (fleetclean.engine.owners).
    owner_actions: dict[str, str] = field(default_factory=dict)
    never_stop_units: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scope:
    """What a run may touch on a shared node.

    ``user``: only that user's processes are signalled (``--user``, a name or a UID);
    ``gpus``: nvidia-smi indexes (``--gpus``): gpu-holders kills only their holders, the
    verification judges only them (the others are shown), and no stage signals a process
    that holds other GPUs and none of these; ``slurm_job``: an epilog's, the job that
    ``SLURM_JOB_ID`` names when the script runs: its leftovers are targets, any other job's
    processes are never touched, and its GPUs (``SLURM_JOB_GPUS``) are the ``gpus``.

    >>> Scope(user="alice", gpus=(0, 3)).describe(), Scope().active
    ("user alice's processes, on GPUs 0,3", False)
    """

    user: str | None = None
    gpus: tuple[int, ...] | None = None
    slurm_job: bool = False

    @property
    def active(self) -> bool:
        return bool(self.user or self.gpus is not None or self.slurm_job)

    def describe(self) -> str:
        who = f"user {self.user}'s processes" if self.user else "processes"
        if self.slurm_job:
            return "the finished Slurm job's GPUs (SLURM_JOB_GPUS), no other job's " + who
        if self.gpus is not None:
            return f"{who}, on GPUs {','.join(map(str, self.gpus))}"
        return who

    def as_json(self) -> dict[str, object]:
        """What a run record keeps of it."""
        return {"user": self.user, "gpus": None if self.gpus is None else list(self.gpus),
                "slurm_job": self.slurm_job}
