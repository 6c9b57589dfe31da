"""Playbook YAML -> :class:`Playbook`, rejecting anything unknown with file:line:column.

A playbook names its variables (with defaults), a list of typed stages and a verification::

    name: post-extraction
    description: Stop SGLang, free every GPU, restore the model file.
    vars: {server_pattern: sglang.launch_server, grace: 10}
    stages:
      - {name: stop-server, type: signal, pattern: "{{ server_pattern }}", grace: "{{ grace }}"}
    verify: {max_used_mib: 0, timeout: 30}

>>> load_playbook("post-extraction").stages[0].type
'guard'

A typo is reported where it was written, with the likely fix::

    stages:
      - {name: stop, type: signal, patern: sglang}
    -> PlaybookError: my.yaml:2:32: stage 'stop': unknown key 'patern' (did you mean 'pattern'?)

Values are kept as written (``{{ var }}`` unresolved); :mod:`fleetclean.engine.variables`
resolves and type-checks them per host, with the checks each stage type declares.
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fleetclean import yamltext
from fleetclean.engine.model import VAR_NAME, Location, Playbook, Stage, Verify
from fleetclean.engine.stages import STAGE_TYPES
from fleetclean.engine.stages.base import REQUIRED, StageType
from fleetclean.engine.stages.verify import VERIFY
from fleetclean.errors import PlaybookError

TOP_KEYS = ("name", "description", "vars", "stages", "verify", "read_only")
STAGE_COMMON = ("name", "type")
BUILTIN_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _builtin_dir() -> Any:
    return resources.files("fleetclean.engine") / "playbooks"


def list_playbooks() -> list[tuple[str, str]]:
    """Built-in playbooks as ``(name, description)``, sorted by name.

    >>> [name for name, _ in list_playbooks()]
    ['free-gpus', 'post-extraction', 'pre-restart', 'status']
    """
    out = []
    for entry in sorted(_builtin_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            pb = _parse(entry.read_text(encoding="utf-8"), entry.name, builtin=True)
            out.append((pb.name, pb.description))
    return out


def load_playbook(name_or_path: str) -> Playbook:
    """Load a built-in playbook by name, or a playbook file by path.

    >>> load_playbook("status").read_only
    True
    >>> load_playbook("post-extractoin")
    Traceback (most recent call last):
    fleetclean.errors.PlaybookError: no playbook 'post-extractoin'... (did you mean ...?)
    """
    path = Path(name_or_path)
    if BUILTIN_NAME.match(name_or_path) and not path.exists():
        entry = _builtin_dir() / f"{name_or_path}.yaml"
        if entry.is_file():
            return _parse(entry.read_text(encoding="utf-8"), f"{name_or_path}.yaml", builtin=True)
        names = [n for n, _ in list_playbooks()]
        raise PlaybookError(
            f"no playbook '{name_or_path}': not a built-in ({', '.join(names)}) nor a file",
            hint=_did_you_mean(name_or_path, names),
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlaybookError(f"cannot read playbook: {exc.strerror}", path=str(path)) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        said, line, column, hint = yamltext.undecodable(data, exc)
        raise PlaybookError(said, path=str(path), line=line, column=column,
                            hint=hint) from None
    return _parse(text, str(path), builtin=False)


def _did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    return f"expected one of: {', '.join(sorted(choices))}" if choices else None


class _Reader:
    """Walks a composed YAML node tree, keeping every value's location."""

    def __init__(self, text: str, path: str) -> None:
        self.path = path
        try:
            # The loader reads the text as it is made: a control character fails here.
            self.loader = yaml.SafeLoader(text)
            self.root = self.loader.get_single_node()
        except yaml.YAMLError as exc:
            said, line, column, hint = yamltext.problem(exc, text)
            raise PlaybookError(f"invalid YAML: {said}", path=path, line=line, column=column,
                                hint=hint) from None

    def loc(self, node: yaml.Node) -> Location:
        return Location(self.path, node.start_mark.line + 1, node.start_mark.column + 1)

    def error(self, node: yaml.Node, message: str, hint: str | None = None) -> PlaybookError:
        where = self.loc(node)
        return PlaybookError(message, path=where.path, line=where.line, column=where.column,
                             hint=hint)

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping")
        out = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = self.value(key_node)
            if not isinstance(key, str):
                raise self.error(key_node, f"{what}: keys must be strings, not {key!r}")
            if key in seen:
                raise self.error(key_node, f"{what}: duplicate key '{key}'")
            seen.add(key)
            out.append((key, key_node, value_node))
        return out


def _parse(text: str, path: str, *, builtin: bool) -> Playbook:
    r = _Reader(text, path)
    if r.root is None:
        raise PlaybookError("empty playbook", path=path)
    top: dict[str, yaml.Node] = {}
    for key, key_node, value_node in r.mapping(r.root, "playbook"):
        if key not in TOP_KEYS:
            raise r.error(key_node, f"unknown key '{key}'", _did_you_mean(key, TOP_KEYS))
        top[key] = value_node
    if "name" not in top:
        raise r.error(r.root, "playbook has no 'name'")
    name = r.value(top["name"])
    if not isinstance(name, str) or not name:
        raise r.error(top["name"], "'name' must be a non-empty string")
    description = r.value(top["description"]) if "description" in top else ""
    if not isinstance(description, str):
        raise r.error(top["description"], "'description' must be a string")

    variables: dict[str, Any] = {}
    var_where: dict[str, Location] = {}
    if "vars" in top and not _is_null(top["vars"]):
        for key, key_node, value_node in r.mapping(top["vars"], "vars"):
            if not VAR_NAME.match(key):
                raise r.error(key_node, f"variable name '{key}' is not an identifier",
                              "use letters, digits and _")
            variables[key] = r.value(value_node)
            var_where[key] = r.loc(value_node)

    stages = _stages(r, top.get("stages"))
    verify = _verify(r, top["verify"]) if "verify" in top and not _is_null(top["verify"]) else None
    if not stages and verify is None:
        raise r.error(top.get("stages", r.root), "playbook has no stages and no verify: it "
                      "would do nothing and report every host clean",
                      "add a 'stages:' list or a 'verify:' section")
    read_only = r.value(top["read_only"]) if "read_only" in top else False
    if not isinstance(read_only, bool):
        raise r.error(top["read_only"], "'read_only' must be true or false")
    return Playbook(name=name, description=description, path=path, vars=variables,
                    stages=stages, verify=verify, var_where=var_where,
                    read_only=read_only, builtin=builtin)


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _stages(r: _Reader, node: yaml.Node | None) -> tuple[Stage, ...]:
    if node is None or _is_null(node):
        return ()
    if not isinstance(node, yaml.SequenceNode):
        raise r.error(node, "'stages' must be a list")
    names: set[str] = set()
    return tuple(_stage(r, i, stage_node, names) for i, stage_node in enumerate(node.value, 1))


def _stage(r: _Reader, i: int, stage_node: yaml.Node, names: set[str]) -> Stage:
    entries = r.mapping(stage_node, f"stage {i}")
    by_key = {key: value_node for key, _, value_node in entries}
    if "type" not in by_key:
        raise r.error(stage_node, f"stage {i} has no 'type'",
                      f"expected one of: {', '.join(STAGE_TYPES)}")
    stype = r.value(by_key["type"])
    if stype not in STAGE_TYPES:
        raise r.error(by_key["type"], f"stage {i}: unknown stage type '{stype}'",
                      _did_you_mean(str(stype), tuple(STAGE_TYPES)))
    name = r.value(by_key["name"]) if "name" in by_key else f"{stype}-{i}"
    if not isinstance(name, str) or not name:
        raise r.error(by_key["name"], f"stage {i}: 'name' must be a non-empty string")
    if name in names:
        raise r.error(by_key["name"], f"stage {i}: duplicate stage name '{name}'")
    names.add(name)
    written = [e for e in entries if e[0] not in STAGE_COMMON]
    options, where = _options(r, stage_node, written, STAGE_TYPES[stype],
                              label=f"stage '{name}'", for_type=f" for type {stype}")
    return Stage(name=name, type=stype, options=options, where=r.loc(stage_node),
                 option_where=where)


def _options(r: _Reader, node: yaml.Node, entries: list[tuple[str, yaml.Node, yaml.Node]],
             stype: StageType, *, label: str, for_type: str = "",
             ) -> tuple[dict[str, Any], dict[str, Location]]:
    """The options written (old spellings mapped to their names), then the defaults of the
    rest; an unknown key or a missing required one is an error at its place."""
    known = tuple(o.name for o in stype.options)
    options: dict[str, Any] = {}
    where: dict[str, Location] = {}
    for key, key_node, value_node in entries:
        if key not in known and key not in stype.aliases:
            raise r.error(key_node, f"{label}: unknown key '{key}'{for_type}",
                          _did_you_mean(key, (*known, *stype.aliases)))
        canonical = stype.aliases.get(key, key)
        if canonical in options:
            raise r.error(key_node, f"{label}: '{key}' repeats '{canonical}'")
        options[canonical] = r.value(value_node)
        where[canonical] = r.loc(value_node)
    for key, default in stype.defaults().items():
        if key not in options:
            if default is REQUIRED:
                raise r.error(node, f"{label}: missing required key '{key}'")
            options[key] = default
            where[key] = r.loc(node)
    return options, where


def _verify(r: _Reader, node: yaml.Node) -> Verify:
    options, where = _options(r, node, r.mapping(node, "verify"), VERIFY, label="verify")
    return Verify(options=options, where=r.loc(node), option_where=where)
