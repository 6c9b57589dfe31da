"""Ansible's YAML inventory format -> a :class:`~fleetclean.inventory.builder.Builder`.

The file is composed into YAML nodes (not loaded into dicts) so that every error names the
line and column of the key or value at fault; Ansible's ``!unsafe`` reads as plain text and
``!vault`` is refused.

>>> from fleetclean.inventory.builder import Builder
>>> b = Builder("lab.yml")
>>> read_yaml("all:\\n  hosts:\\n    gpu01: {ansible_port: 2222}\\n", b)
>>> b.hosts["gpu01"]["ansible_port"]  # doctest: +ELLIPSIS
Value(value=2222, line=3, column=27, path='lab.yml')
>>> read_yaml("all:\\n  hosts:\\n    - gpu01\\n", Builder("lab.yml"))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: lab.yml:3:5: 'hosts' of group 'all' must be a mapping, ...
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

import yaml

from fleetclean import yamltext
from fleetclean.errors import InventoryError
from fleetclean.inventory.builder import Builder, Value, valid_name

__all__ = ["read_vars", "read_yaml"]

GROUP_KEYS = ("hosts", "children", "vars")
_NULL = "tag:yaml.org,2002:null"


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` rules, plus Ansible's ``!unsafe`` marker read as plain text."""


_Loader.add_constructor(
    "!unsafe",
    lambda loader, node: loader.construct_scalar(node),  # type: ignore[arg-type]
)

# libyaml's parser, when PyYAML has it, for files that parse: composing a 64-host inventory
# in pure Python costs about 60 ms, a tenth of a fleet-wide status. Same nodes and marks.
if TYPE_CHECKING:
    AnyLoader = yaml.SafeLoader | yaml.CSafeLoader  # CSafeLoader exists only with libyaml
_FastLoader: type[AnyLoader] = _Loader
if hasattr(yaml, "CSafeLoader"):

    class _CLoader(yaml.CSafeLoader):
        yaml_constructors = _Loader.yaml_constructors

    _FastLoader = _CLoader


def _compose(text: str) -> tuple[AnyLoader, yaml.Node | None]:
    """The root node of ``text`` and the loader that made it; YAMLError if it is broken.

    A broken file is parsed again by the pure-Python parser: libyaml words syntax errors
    differently, and the hints are written for the pure-Python messages."""
    fast = _FastLoader(text)
    try:
        return fast, fast.get_single_node()
    except yaml.YAMLError:
        fast.dispose()
    slow = _Loader(text)
    try:
        return slow, slow.get_single_node()
    except yaml.YAMLError:
        slow.dispose()
        raise


class _YamlReader:
    """Walks the composed YAML nodes so every error can name its line and column."""

    def __init__(self, builder: Builder, loader: AnyLoader) -> None:
        self.b = builder
        self.loader = loader

    def error(self, message: str, node: yaml.Node, hint: str | None = None) -> InventoryError:
        mark = node.start_mark
        return self.b.error(message, mark.line + 1, mark.column + 1, hint)

    def pairs(self, node: yaml.MappingNode) -> list[tuple[str, yaml.Node, yaml.Node]]:
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or not str(key_node.value).strip():
                raise self.error("a key here must be a name", key_node, hint="write 'name:'")
            key = str(key_node.value)
            if key in seen and key != "<<":
                raise self.error(
                    f"duplicate key '{key}' (first at line {seen[key].start_mark.line + 1})",
                    key_node,
                    hint="merge the two entries into one",
                )
            seen[key] = key_node
        # YAML merge keys (<<: *defaults) put the merged pairs first: a later pair wins.
        self.loader.flatten_mapping(node)
        out: dict[str, tuple[str, yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            out[str(key_node.value)] = (str(key_node.value), key_node, value_node)
        return list(out.values())

    def top(self, root: yaml.Node) -> None:
        if not isinstance(root, yaml.MappingNode):
            raise self.error(
                f"an inventory is a mapping of groups, got {_kind(root)}",
                root,
                hint="start the file with 'all:'",
            )
        for name, key_node, value_node in self.pairs(root):
            if name in GROUP_KEYS:
                raise self.error(
                    f"'{name}:' at the top level must sit inside a group",
                    key_node,
                    hint="indent it under 'all:'",
                )
            self.group(name, key_node, value_node, parent=None)

    def group(self, name: str, key_node: yaml.Node, node: yaml.Node, parent: str | None) -> None:
        mark = key_node.start_mark
        self.b.group(name, mark.line + 1, mark.column + 1)
        if parent is not None:
            self.b.add_child(parent, name, mark.line + 1, mark.column + 1)
        if _is_null(node):
            return
        if not isinstance(node, yaml.MappingNode):
            raise self.error(
                f"group '{name}' must be a mapping of hosts, children and vars, got {_kind(node)}",
                node,
                hint="give it 'hosts:', 'children:' or 'vars:' keys",
            )
        for key, k_node, v_node in self.pairs(node):
            if key == "hosts":
                self.hosts(name, v_node)
            elif key == "children":
                for child, c_key, c_node in self.mapping(
                    v_node, f"'children' of group '{name}'", "write each child group as 'name:'"
                ):
                    self.group(child, c_key, c_node, parent=name)
            elif key == "vars":
                self.b.groups[name].vars.update(self.variables(v_node, f"group '{name}'"))
            else:
                close = difflib.get_close_matches(key, GROUP_KEYS, n=1)
                raise self.error(
                    f"unknown key '{key}' in group '{name}'",
                    k_node,
                    hint=f"did you mean '{close[0]}'?"
                    if close
                    else "a group holds only 'hosts:', 'children:' and 'vars:'",
                )

    def mapping(
        self, node: yaml.Node, what: str, hint: str
    ) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if _is_null(node):
            return []
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{what} must be a mapping, got {_kind(node)}", node, hint=hint)
        return self.pairs(node)

    def hosts(self, group: str, node: yaml.Node) -> None:
        entries = self.mapping(
            node,
            f"'hosts' of group '{group}'",
            "write each host as 'gpu01:' on its own line, not '- gpu01'",
        )
        for pattern, key_node, value_node in entries:
            if _is_null(value_node):
                variables = {}
            elif isinstance(value_node, yaml.MappingNode):
                variables = self.variables(value_node, f"host '{pattern}'")
            else:
                example = (
                    f"'{pattern}: {{ansible_host: {value_node.value}}}'"
                    if isinstance(value_node, yaml.ScalarNode)
                    else f"'{pattern}: {{key: value}}'"
                )
                raise self.error(
                    f"host '{pattern}' must map to its variables or to nothing, "
                    f"got {_kind(value_node)}",
                    value_node,
                    hint=f"write {example}",
                )
            mark = key_node.start_mark
            self.b.add_hosts(group, pattern, variables, mark.line + 1, mark.column + 1)

    def variables(
        self, node: yaml.Node, owner: str, sealed: list[Value] | None = None,
        odd: list[Value] | None = None,
    ) -> dict[str, Value]:
        """``owner``'s variables; with ``sealed``, a '!vault' value is left out and its
        name (where it was written) added there, instead of being an error; with ``odd``,
        so is a name no variable can have (Ansible reads those in vars files unchecked)."""
        out: dict[str, Value] = {}
        for key, key_node, value_node in self.mapping(
            node, f"variables of {owner}", "write 'key: value' lines"
        ):
            mark = key_node.start_mark
            if odd is not None and not valid_name(key):
                odd.append(self.b.located(key, mark.line + 1, mark.column + 1))
                continue
            self.b.variable_name(key, mark.line + 1, mark.column + 1)
            if sealed is not None and _find_tag(value_node, "!vault") is not None:
                sealed.append(self.b.located(key, mark.line + 1, mark.column + 1))
                continue
            out[key] = self.b.located(
                self.construct(value_node),
                value_node.start_mark.line + 1,
                value_node.start_mark.column + 1,
            )
        return out

    def construct(self, node: yaml.Node) -> Any:
        vault = _find_tag(node, "!vault")
        if vault is not None:
            raise self.error(
                "encrypted '!vault' values cannot be read",
                vault,
                hint="decrypt the value or pass it with -e",
            )
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as err:
            at = err.problem_mark or node.start_mark
            raise self.b.error(
                f"YAML tag '{_bad_tag(node)}' is not allowed",
                at.line + 1,
                at.column + 1,
                hint="inventories hold plain values; remove the tag",
            ) from None


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"'{node.value}'"


def _find_tag(node: yaml.Node, tag: str) -> yaml.Node | None:
    if node.tag == tag:
        return node
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    for child in children:
        found = _find_tag(child, tag)
        if found is not None:
            return found
    return None


def _bad_tag(node: yaml.Node) -> str:
    """The first tag below ``node`` that the safe loader has no constructor for."""
    constructors = _Loader.yaml_constructors
    if node.tag not in constructors:
        return str(node.tag)
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    for child in children:
        tag = _bad_tag(child)
        if tag:
            return tag
    return ""


def read_vars(
    text: str, builder: Builder
) -> tuple[dict[str, Value], list[Value], list[Value]]:
    """The variables of a group_vars/ or host_vars/ file (``builder.path``, which errors
    name), the names of those left out because their value is '!vault'-encrypted, and those
    left out because no variable can be named so (``nginx-port``: Ansible reads the file,
    so it must not stop the run; no variable of fleetclean's is named so).

    JSON is YAML, except for a tab between tokens: a file that YAML refuses but JSON
    reads is taken as JSON, as Ansible reads JSON first (its values name no line then).

    >>> read_vars("ansible_user: root\\ngrace: 5\\n", Builder("group_vars/all.yml"))
    ... # doctest: +NORMALIZE_WHITESPACE
    ({'ansible_user': Value(value='root', line=1, column=15, path='group_vars/all.yml'),
      'grace': Value(value=5, line=2, column=8, path='group_vars/all.yml')}, [], [])
    >>> read_vars("- root\\n", Builder("group_vars/all.yml"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fleetclean.errors.InventoryError: group_vars/all.yml:1:1: a variables file is a mapping...
    """
    loader: AnyLoader | None = None
    sealed: list[Value] = []
    odd: list[Value] = []
    try:
        loader, root = _compose(text)
        if root is None:  # empty, or comments only: Ansible ignores it
            return {}, [], []
        if not isinstance(root, yaml.MappingNode):
            raise _YamlReader(builder, loader).error(
                f"a variables file is a mapping of names to values, got {_kind(root)}",
                root,
                hint="write one 'name: value' a line",
            )
        found = _YamlReader(builder, loader).variables(root, builder.path, sealed, odd)
        return found, sealed, odd
    except yaml.YAMLError as err:
        from_json = _json_vars(text, builder, odd)
        if from_json is not None:
            return from_json, [], odd
        said, line, column, hint = yamltext.problem(err, text)
        raise builder.error(f"not valid YAML: {said}", line, column, hint=hint) from None
    finally:
        if loader is not None:
            loader.dispose()


def _json_vars(text: str, builder: Builder, odd: list[Value]) -> dict[str, Value] | None:
    """``text`` read as a JSON object, or None when it is no JSON object; names no variable
    can have are left out, into ``odd``."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    odd += [builder.located(key, None, None) for key in data if not valid_name(key)]
    return {key: builder.located(value, None, None) for key, value in data.items()
            if valid_name(key)}


def read_yaml(text: str, builder: Builder) -> None:
    loader: AnyLoader | None = None
    try:
        loader, root = _compose(text)
        if root is None:
            raise builder.error(
                "inventory file is empty", None, None, hint="add 'all:' with 'hosts:'"
            )
        _YamlReader(builder, loader).top(root)
    except yaml.YAMLError as err:
        said, line, column, hint = yamltext.problem(err, text)
        raise builder.error(f"not valid YAML: {said}", line, column, hint=hint) from None
    finally:
        if loader is not None:
            loader.dispose()


