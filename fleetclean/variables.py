"""Variables: precedence, ``-e`` parsing, strict ``{{ name }}`` substitution, type checks.

Precedence, lowest first: built-in defaults (``protect``, ``lock_wait``, ``force``) <
playbook ``vars`` < inventory group/host vars (``Host.vars``) < ``-e`` values.

>>> parse_extra_vars(["grace=5", '{"max_used_mib": 100}'])
{'grace': '5', 'max_used_mib': 100}
>>> substitute("{{ dump_dir }}/x", {"dump_dir": "/dev/shm/hs"}, where=None)
'/dev/shm/hs/x'
>>> substitute("{{ dump_dri }}", {"dump_dir": "/dev/shm/hs"}, where=None)
Traceback (most recent call last):
fleetclean.errors.VariableError: undefined variable 'dump_dri' (did you mean 'dump_dir'?)

Substitution only produces *values*; the renderer shell-quotes every one of them and the
stage bash reads them as ``"$var"``, so no value can ever become code.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetclean.errors import VariableError
from fleetclean.playbook import VAR_NAME, Location, Playbook, Stage

BUILTIN_VARS: dict[str, Any] = {"protect": [], "lock_wait": 5, "force": False}
"""Variables every playbook has; a playbook or inventory may override them."""

DEFAULT_PROTECT = (
    "sshd", "systemd", "init", "nvidia-persistenced", "nv-hostengine", "dcgm-exporter",
    "nv-fabricmanager", "Xorg",
)
"""Process names (comm or argv[0] basename) no stage ever signals."""

SIGNALS = ("TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2")

_TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_WHOLE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")
# Constructs Python's re accepts that bash's =~ (POSIX ERE) reads differently or rejects.
_PY_ONLY_ESCAPES = set("dDAZzxuUNpPgk0123456789")


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
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise VariableError(f"-e @{path}: cannot read: {exc.strerror}", path=path) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise VariableError(f"invalid YAML: {exc.problem}", path=path,
                            line=mark.line + 1 if mark else None,
                            column=mark.column + 1 if mark else None) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise VariableError("a variables file must hold a mapping", path=path)
    return data


def resolve_vars(playbook: Playbook, host_vars: Mapping[str, Any],
                 extra: Mapping[str, Any]) -> dict[str, Any]:
    """The effective variables for one host, checked against every stage of the playbook.

    Raises :class:`VariableError` (naming the playbook file:line) for an undefined
    variable or a value of the wrong type, before anything is sent anywhere.

    >>> from fleetclean.playbook import load_playbook
    >>> pb = load_playbook("post-extraction")
    >>> resolve_vars(pb, {"grace": 3}, {"grace": "7"})["grace"]
    '7'
    >>> resolve_vars(pb, {}, {"grace": "soon"})
    Traceback (most recent call last):
    VariableError: post-extraction.yaml:...: stage 'stop-server': grace must be ... not 'soon'
    """
    merged: dict[str, Any] = {**BUILTIN_VARS, **playbook.vars, **host_vars, **extra}
    resolve_playbook(playbook, merged)
    return merged


# ------------------------------------------------------------------------ substitution


def _scalar_text(value: Any, name: str, where: Location | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (str, int, float)):
        return str(value)
    raise _err(where, f"variable '{name}' is a {type(value).__name__}; it can only be used "
                      "as a whole value, not inside a string")


def _lookup(name: str, variables: Mapping[str, Any], where: Location | None) -> Any:
    if name not in variables:
        close = difflib.get_close_matches(name, list(variables), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "set it with -e {name}=VALUE"
        if not close:
            hint = f"set it with -e {name}=VALUE or in the inventory"
        raise _err(where, f"undefined variable '{name}'", hint)
    return variables[name]


def _err(where: Location | None, message: str, hint: str | None = None) -> VariableError:
    if where is None:
        return VariableError(message, hint=hint)
    return VariableError(message, path=where.path, line=where.line, column=where.column,
                         hint=hint)


def substitute(value: Any, variables: Mapping[str, Any], where: Location | None) -> Any:
    """Replace ``{{ name }}`` in strings (recursively in lists). A string that is exactly
    one reference takes the variable's own type (``"{{ grace }}"`` -> ``10``)."""
    if isinstance(value, list):
        return [substitute(v, variables, where) for v in value]
    if not isinstance(value, str):
        return value
    whole = _WHOLE.match(value)
    if whole:
        return _lookup(whole.group(1), variables, where)

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if not VAR_NAME.match(name):
            raise _err(where, f"unsupported expression '{{{{{match.group(1)}}}}}'",
                       "only {{ name }} is supported: no filters, no expressions")
        return _scalar_text(_lookup(name, variables, where), name, where)

    out = _TEMPLATE.sub(one, value)
    if "{{" in _TEMPLATE.sub("", value) or "}}" in _TEMPLATE.sub("", value):
        raise _err(where, f"unbalanced '{{{{' or '}}}}' in {value!r}")
    return out


# ------------------------------------------------------------------------ typed values


@dataclass(frozen=True)
class ResolvedStage:
    """A stage whose options are substituted and type-checked, ready to render."""

    name: str
    type: str
    options: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # shell stage: FC_VAR_x -> value


@dataclass(frozen=True)
class ResolvedPlaybook:
    stages: tuple[ResolvedStage, ...]
    verify: dict[str, Any] | None  # max_used_mib (int), timeout, interval, settle (s)
    protect: tuple[str, ...]
    lock_wait: float
    force: bool


def resolve_playbook(playbook: Playbook, variables: Mapping[str, Any]) -> ResolvedPlaybook:
    """Substitute and type-check every stage and the verification for one host."""
    stages = tuple(_resolve_stage(s, variables) for s in playbook.stages)
    verify = None
    if playbook.verify is not None:
        v = playbook.verify

        def get(key: str) -> tuple[Any, Location]:
            where = v.option_where[key]
            return substitute(v.options[key], variables, where), where

        verify = {
            "max_used_mib": _int(*get("max_used_mib"), "verify: max_used_mib"),
            "timeout": _number(*get("timeout"), "verify: timeout"),
            "interval": _number(*get("interval"), "verify: interval", positive=True),
            "settle": _number(*get("settle"), "verify: settle"),
        }
    var_where = playbook.var_where.get
    protect = _names(variables.get("protect", []), var_where("protect"))
    lock_wait = _number(variables.get("lock_wait", 5), var_where("lock_wait"), "lock_wait")
    force = _bool(variables.get("force", False), var_where("force"), "force")
    return ResolvedPlaybook(stages=stages, verify=verify,
                            protect=tuple(dict.fromkeys((*DEFAULT_PROTECT, *protect))),
                            lock_wait=lock_wait, force=force)


def _resolve_stage(stage: Stage, variables: Mapping[str, Any]) -> ResolvedStage:
    label = f"stage '{stage.name}'"
    out: dict[str, Any] = {}
    env: dict[str, str] = {}
    for key, raw in stage.options.items():
        where = stage.option_where.get(key, stage.where)
        what = f"{label}: {key}"
        if stage.type == "shell" and key == "command":
            out[key] = _shell_command(raw, variables, where, env)
            continue
        value = substitute(raw, variables, where)
        checker = _CHECKS.get(key, _text)
        out[key] = checker(value, where, what)
        if key == "paths":
            out["globs"] = _glob_flags(raw, len(out[key]))
    return ResolvedStage(name=stage.name, type=stage.type, options=out, env=env)


def _shell_command(raw: Any, variables: Mapping[str, Any], where: Location,
                   env: dict[str, str]) -> str:
    """``{{ x }}`` in a shell command becomes ``"${FC_VAR_x}"``, the value travelling in
    the environment: a value is never spliced into code."""
    if not isinstance(raw, str) or not raw.strip():
        raise _err(where, "shell: command must be a non-empty string")

    quoted, double_quoted = _quoted_offsets(raw)

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if not VAR_NAME.match(name):
            raise _err(where, f"unsupported expression '{{{{{match.group(1)}}}}}'",
                       "only {{ name }} is supported")
        if match.start() in quoted:
            # '{{ x }}' would become '"${FC_VAR_x}"': the literal text, never the value.
            raise _err(where, f"shell: '{{{{ {name} }}}}' is inside single quotes, where bash "
                              "would never expand it",
                       f"write {{{{ {name} }}}} unquoted: it is substituted as one quoted word")
        value = _lookup(name, variables, where)
        if isinstance(value, list):
            value = " ".join(_scalar_text(v, name, where) for v in value)
        env[f"FC_VAR_{name}"] = _no_nul(_scalar_text(value, name, where), where, name)
        if match.start() in double_quoted:  # already inside "...": quotes would close it
            return f"${{FC_VAR_{name}}}"
        return f'"${{FC_VAR_{name}}}"'

    return _TEMPLATE.sub(one, raw)


def _quoted_offsets(command: str) -> tuple[set[int], set[int]]:
    """Offsets of ``command`` that bash reads inside '...' and inside "..." (backslashes
    tracked, so "it's" and \\' do not open a single-quoted string)."""
    inside: set[int] = set()
    in_double: set[int] = set()
    single = double = escaped = False
    for i, ch in enumerate(command):
        if double:
            in_double.add(i)
        if single:
            if ch == "'":
                single = False
            else:
                inside.add(i)
        elif escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            double = not double
        elif ch == "'" and not double:
            single = True
    return inside, in_double


def _no_nul(text: str, where: Location | None, what: str) -> str:
    if "\0" in text:
        raise _err(where, f"{what}: contains a NUL byte, which bash cannot carry")
    return text


def _text(value: Any, where: Location | None, what: str) -> str:
    if isinstance(value, (list, dict)):
        raise _err(where, f"{what} must be a string, not a {type(value).__name__}")
    return _no_nul(_scalar_text(value, what, where), where, what)


def _number(value: Any, where: Location | None, what: str, *, positive: bool = False) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 0 or (positive and number == 0):
        kind = "a positive" if positive else "a non-negative"
        raise _err(where, f"{what} must be {kind} number of seconds, not {value!r}")
    return number


def _int(value: Any, where: Location | None, what: str) -> int:
    if isinstance(value, bool):
        value = None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise _err(where, f"{what} must be a non-negative integer, not {value!r}")
    return value


def _bool(value: Any, where: Location | None, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", ""):
        return False
    raise _err(where, f"{what} must be true or false, not {value!r}")


def _signal(value: Any, where: Location | None, what: str) -> str:
    name = str(value).upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise _err(where, f"{what}: unknown signal {value!r}",
                   f"expected one of: {', '.join(SIGNALS)}")
    return name


def check_ere(pattern: str, where: Location | None, what: str) -> str:
    """Accept a regex only if Python compiles it and bash's POSIX ERE reads it the same
    way: no ``(?...)`` groups, lazy quantifiers or Perl escapes such as ``\\d``.

    >>> check_ere(r"sglang\\.launch_server", None, "pattern")
    'sglang\\\\.launch_server'
    >>> check_ere(r"worker\\d+", None, "pattern")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: pattern: '\\\\d' is not POSIX ERE ... ([0-9] ...)
    """
    text = _text(pattern, where, what)
    if not text:
        # bash's [[ x =~ "" ]] is true for every x: an empty pattern would target every
        # process on the host.
        raise _err(where, f"{what} is empty, so it would match every process",
                   "give a specific pattern, e.g. -e server_pattern=sglang.launch_server")
    try:
        re.compile(text)
    except re.error as exc:
        raise _err(where, f"{what}: invalid regular expression {text!r}: {exc}") from exc
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _PY_ONLY_ESCAPES:
                raise _err(where, f"{what}: '\\{nxt}' is not POSIX ERE (bash =~ reads it "
                                  f"differently) in {text!r}",
                           "use [0-9] for \\d, or a bracket expression")
            i += 2
            continue
        if ch == "(" and text[i + 1:i + 2] == "?":
            raise _err(where, f"{what}: '(?' groups are not POSIX ERE in {text!r}")
        if ch in "*+?}" and text[i + 1:i + 2] == "?":
            raise _err(where, f"{what}: lazy quantifier '{ch}?' is not POSIX ERE in {text!r}")
        i += 1
    if re.search(text, "") is not None:
        raise _err(where, f"{what}: {text!r} matches the empty string, so it matches "
                          "every process", "make the pattern specific")
    return text


def _abs_path(value: Any, where: Location | None, what: str) -> str:
    text = _text(value, where, what)
    if text and not text.startswith("/"):
        raise _err(where, f"{what} must be an absolute path, not {text!r}")
    return text


def _paths(value: Any, where: Location | None, what: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        text = _abs_path(item, where, what)
        if not text:
            raise _err(where, f"{what}: empty path")
        parts = [p for p in Path(text).parts if p not in ("/", ".")]
        depth = 0
        for part in parts:
            depth = max(depth - 1, 0) if part == ".." else depth + 1
        if depth < 2:
            raise _err(where, f"{what}: refusing {text!r}: it is / or a top-level directory",
                       "name a path at least two levels deep, e.g. /dev/shm/sglang_hs")
        out.append(text)
    return out


def _glob_flags(raw: Any, count: int) -> list[bool]:
    """Which paths are globs: only wildcards written in the playbook itself count, so a
    variable's value is always a literal path (``-e dump_dir='*'`` removes nothing else)."""
    items = raw if isinstance(raw, list) else [raw]
    if len(items) != count:  # one "{{ list_var }}" became several literal paths
        return [False] * count
    return [isinstance(i, str) and any(c in _TEMPLATE.sub("", i) for c in "*?[")
            for i in items]


def _names(value: Any, where: Location | None) -> list[str]:
    """``protect`` as a list, or a comma/space-separated string."""
    if isinstance(value, str):
        return [n for n in re.split(r"[\s,]+", value) if n]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [_no_nul(v.strip(), where, "protect") for v in value if v.strip()]
    raise _err(where, f"protect must be a list of names or a comma-separated string, "
                      f"not {value!r}")


# Command lines that no teardown means to target. A pattern matching several of them
# ('.+', 's', '[a-z]') would signal most of a host.
_BYSTANDERS = (
    "/sbin/init", "sshd: root@notty", "-bash", "/usr/lib/systemd/systemd-journald",
    "/usr/sbin/cron -f", "sleep 60", "/usr/bin/dockerd -H fd://", "tmux", "vim notes.txt",
    "top",
)


def check_target_pattern(value: Any, where: Location | None, what: str) -> str:
    """A stage's target pattern: a valid ERE (see :func:`check_ere`) that is not so broad
    that it matches ordinary processes.

    >>> check_target_pattern("sglang", None, "pattern")
    'sglang'
    >>> check_target_pattern(".+", None, "pattern")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: pattern: '.+' would match ordinary processes ...
    """
    text = check_ere(value, where, what)
    hits = [c for c in _BYSTANDERS if re.search(text, c)]
    if len(hits) >= 3:
        shown = ", ".join(repr(c) for c in hits[:3])
        raise _err(where, f"{what}: {text!r} would match ordinary processes such as {shown}",
                   "make the pattern name what you mean to stop, e.g. sglang.launch_server")
    return text


def _ere_or_empty(value: Any, where: Location | None, what: str) -> str:
    text = _text(value, where, what)
    return check_ere(text, where, what) if text else ""


_CHECKS: dict[str, Any] = {
    "pattern": check_target_pattern,
    "filter": _ere_or_empty,
    "wait_for_line": _ere_or_empty,
    "grace": _number,
    "kill_wait": _number,
    "timeout": _number,
    "signal": _signal,
    "tree": _bool,
    "missing_ok": _bool,
    "file": _abs_path,
    "path": _abs_path,
    "wait_for_file": _abs_path,
    "paths": _paths,
}
