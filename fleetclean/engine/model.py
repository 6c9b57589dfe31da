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
    variables: dict[str, Any] = field(default_factory=dict)
    # What a stage does to a target, per owner kind, and the units never stopped
    # (fleetclean.engine.owners).
    owner_actions: dict[str, str] = field(default_factory=dict)
    never_stop_units: tuple[str, ...] = ()
