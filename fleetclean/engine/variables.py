"""Variables: precedence, ``-e`` parsing, and one host's :class:`ResolvedPlaybook`.

Precedence, lowest first: built-in defaults (``protect``, ``lock_wait``, ``force``,
``smi_timeout``) <
playbook ``vars`` < inventory group/host vars (``Host.vars``) < ``-e`` values. Each
option is substituted (:mod:`fleetclean.engine.substitute`) and checked by the check its
stage type declares for it (:mod:`fleetclean.engine.stages`).

>>> parse_extra_vars(["grace=5", '{"max_used_mib": 100}'])
{'grace': '5', 'max_used_mib': 100}
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from fleetclean import yamltext
from fleetclean.engine import owners
from fleetclean.engine.checks import boolean, names, number
from fleetclean.engine.model import (
    SMI_TIMEOUT_S,
    VAR_NAME,
    Location,
    Playbook,
    ResolvedPlaybook,
    ResolvedStage,
)
from fleetclean.engine.stages import stage_type
from fleetclean.engine.stages.base import StageType
from fleetclean.engine.stages.verify import VERIFY
from fleetclean.engine.substitute import substitute
from fleetclean.errors import VariableError

BUILTIN_VARS: dict[str, Any] = {"protect": [], "lock_wait": 5, "force": False,
                                "smi_timeout": SMI_TIMEOUT_S, **owners.VARIABLES}
"""Variables every playbook has; a playbook or inventory may override them (``owner_*``
and ``never_stop_units``: :mod:`fleetclean.engine.owners`)."""

DEFAULT_PROTECT = (
    # OpenSSH 9.8 and later run each connection as sshd-session (and its authentication as
    # sshd-auth), no longer as sshd.
    "sshd", "sshd-session", "sshd-auth", "systemd", "init", "nvidia-persistenced",
    "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "Xorg",
)
"""Process names (comm or argv[0] basename) no stage ever signals."""



def parse_extra_vars(items: list[str]) -> dict[str, Any]:
    """Merge ``-e`` items, later ones winning: ``KEY=VALUE`` (a string), ``@file.yaml``
    (a mapping) or a JSON object.

    >>> parse_extra_vars(["protect=jupyter,tensorboard", "grace=3"])
    {'protect': 'jupyter,tensorboard', 'grace': '3'}
    >>> parse_extra_vars(["grace"])
    Traceback (most recent call last):
    fleetclean.errors.VariableError: -e 'grace': expected KEY=VALUE, @FILE.yaml or a JSON object
    """
    out: dict[str, Any] = {}
    for item in items:
        if item.startswith("@"):
            data = _load_vars_file(item[1:])
        elif item.lstrip().startswith("{"):
            try:
                data = json.loads(item)
            except json.JSONDecodeError as exc:
                raise VariableError(f"-e {item!r}: invalid JSON: {exc.msg} at column "
                                    f"{exc.colno}") from exc
            if not isinstance(data, dict):
                raise VariableError(f"-e {item!r}: JSON must be an object")
        elif "=" in item:
            key, _, value = item.partition("=")
            data = {key.strip(): value}
        else:
            raise VariableError(
                f"-e {item!r}: expected KEY=VALUE, @FILE.yaml or a JSON object")
        for key in data:
            if not isinstance(key, str) or not VAR_NAME.match(key):
                raise VariableError(f"-e {item!r}: variable name {key!r} is not an identifier")
        out.update(data)
    return out


def _load_vars_file(path: str) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise VariableError(f"-e @{path}: cannot read: {exc.strerror}", path=path) from exc
    try:
        text = raw.decode("utf-8")
        data = yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        said, line, column, hint = yamltext.undecodable(raw, exc)
        raise VariableError(said, path=path, line=line, column=column, hint=hint) from None
    except yaml.YAMLError as exc:
        said, at_line, at_column, fix = yamltext.problem(exc, text)
        raise VariableError(f"invalid YAML: {said}", path=path, line=at_line,
                            column=at_column, hint=fix) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise VariableError("a variables file must hold a mapping", path=path)
    return data


def resolve(playbook: Playbook, host_vars: Mapping[str, Any],
            extra: Mapping[str, Any], host: str = "") -> ResolvedPlaybook:
    """The playbook for one host: its effective variables, every stage and the
    verification substituted and type-checked.

    Raises :class:`VariableError` (naming the playbook file:line) for an undefined
    variable or a value of the wrong type, before anything is sent anywhere.

    >>> from fleetclean.engine.playbook import load_playbook
    >>> pb = load_playbook("post-extraction")
    >>> resolved = resolve(pb, {"grace": 3}, {"grace": "7"})
    >>> resolved.variables["grace"], resolved.stages[1].options["grace"]
    ('7', 7.0)
    >>> resolve(pb, {}, {"grace": "soon"})
    Traceback (most recent call last):
    fleetclean.errors.VariableError: -e grace: stage 'stop-server': grace must be ...
    """
    merged: dict[str, Any] = {**BUILTIN_VARS, **playbook.vars, **host_vars, **extra}
    of = f" of host {host}" if host else ""
    origins = {**{k: f"inventory variable '{k}'{of}" for k in host_vars},
               **{k: f"-e {k}" for k in extra}}
    return resolve_playbook(playbook, merged, given=(*host_vars, *extra), origins=origins)


def resolve_playbook(playbook: Playbook, variables: Mapping[str, Any],
                     given: tuple[str, ...] = (),
                     origins: Mapping[str, str] | None = None) -> ResolvedPlaybook:
    """Substitute and type-check every stage and the verification with ``variables``
    (already merged: see :func:`resolve`); ``given`` names the variables set outside the
    playbook (inventory, ``-e``), whose errors name no playbook line: ``origins`` says
    where each came from ("-e grace"), which an error names instead."""
    origins = origins or {}
    stages = tuple(
        _resolve_options(stage_type(s.type), s.options, variables, name=s.name, where=s.where,
                         option_where=s.option_where, label=f"stage '{s.name}': ",
                         origins=origins)
        for s in playbook.stages)
    verify = None
    if playbook.verify is not None:
        v = playbook.verify
        in_order = {o.name: v.options[o.name] for o in VERIFY.options}
        verify = _resolve_options(VERIFY, in_order, variables, name="verify", where=v.where,
                                  option_where=v.option_where, label="verify: ",
                                  origins=origins)
    var_where = playbook.var_where.get
    in_playbook = {k: v for k, v in playbook.var_where.items() if k not in given}
    with _blamed_on(origins, "protect"):
        protect = names(variables.get("protect", []), var_where("protect"))
    with _blamed_on(origins, "lock_wait"):
        lock_wait = number(variables.get("lock_wait", BUILTIN_VARS["lock_wait"]),
                           var_where("lock_wait"), "lock_wait")
    with _blamed_on(origins, "smi_timeout"):
        smi_timeout = number(variables.get("smi_timeout", SMI_TIMEOUT_S), var_where("smi_timeout"),
                             "smi_timeout", positive=True)
    with _blamed_on(origins, "force"):
        force = boolean(variables.get("force", False), var_where("force"), "force")
    return ResolvedPlaybook(
        name=playbook.name, path=playbook.path, builtin=playbook.builtin,
        read_only=playbook.read_only, stages=stages, verify=verify,
        protect=tuple(dict.fromkeys((*DEFAULT_PROTECT, *protect))),
        lock_wait=lock_wait, force=force, smi_timeout=smi_timeout, variables=dict(variables),
        owner_actions=owners.actions(variables, in_playbook),
        never_stop_units=owners.never_stop(variables, in_playbook))


def _resolve_options(stype: StageType, options: Mapping[str, Any],
                     variables: Mapping[str, Any], *, name: str, where: Location,
                     option_where: Mapping[str, Location], label: str,
                     origins: Mapping[str, str]) -> ResolvedStage:
    """Each option through its stage type's resolver, or substitution then its check."""
    out: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key, raw in options.items():
        at = option_where.get(key, where)
        option = stype.option(key)
        one = raw[0] if isinstance(raw, list) and len(raw) == 1 else raw  # paths: [x]
        whole = _WHOLE_VAR.fullmatch(one) if isinstance(one, str) else None
        with _blamed_on(origins, whole[1] if whole else None):
            if option.resolver is not None:
                out[key] = option.resolver(raw, variables, at, f"{label}{key}", env)
            else:
                out[key] = option.check(substitute(raw, variables, at), at, f"{label}{key}")
    return ResolvedStage(name=name, type=stype.name, options=out, env=env)


# An option that is one variable and nothing else: "{{ grace }}".
_WHOLE_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@contextlib.contextmanager
def _blamed_on(origins: Mapping[str, str], name: str | None) -> Iterator[None]:
    """A bad value of variable ``name`` set by -e or the inventory is that setting's error:
    named as "-e grace", not by the line of a playbook (a built-in one, often) that the
    user never wrote."""
    try:
        yield
    except VariableError as exc:
        if name is None or name not in origins:
            raise
        exc.path, exc.line, exc.column = origins[name], None, None
        raise
