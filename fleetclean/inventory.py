"""Ansible inventories (YAML or INI) -> :class:`~fleetclean.models.Host` values.

Reading happens in three steps, so each can be tested on its own:

1. text -> groups, host patterns and variables with the line/column they came from
   (YAML here, INI in :mod:`fleetclean.inventory_ini`);
2. precedence, as Ansible documents it: ``all`` < parent groups < child groups < host, and
   among groups of one depth ``ansible_group_priority`` (default 1) then the group name
   (alphabetical, the later name wins);
3. connection variables -> Host fields, with ``~/.ssh/config`` filling what the inventory
   leaves open (:mod:`fleetclean.sshconfig`). Every other variable is a playbook variable
   and lands in ``Host.vars``.

``Host.groups`` is Ansible's ``group_names``: every group the host is in, parents included,
sorted, without ``all``; a host in no group but ``all`` is in ``ungrouped``, as in Ansible.

>>> import pathlib, tempfile
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "lab.yml").write_text(
...     "all:\\n  vars: {max_used_mib: 1024}\\n  children:\\n    training:\\n"
...     "      hosts:\\n        h200-[01:02]: {ansible_user: root}\\n")
>>> inv = load_inventory(tmp / "lab.yml", ssh_config=None)
>>> [(h.name, h.user, h.port, h.groups, h.vars) for h in inv.select("training")]
... # doctest: +NORMALIZE_WHITESPACE
[('h200-01', 'root', 22, ('training',), {'max_used_mib': 1024}),
 ('h200-02', 'root', 22, ('training',), {'max_used_mib': 1024})]
>>> _ = (tmp / "bad.yml").write_text("all:\\n  childern:\\n")
>>> load_inventory(tmp / "bad.yml")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: .../bad.yml:2:3: unknown key 'childern' in group 'all' (did...
"""

from __future__ import annotations

import datetime
import difflib
import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import paramiko
import yaml
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fleetclean import inventory_ini, ranges, sshconfig
from fleetclean.errors import InventoryError
from fleetclean.limit import select_names
from fleetclean.models import Connection, Host

__all__ = ["Inventory", "inventory_json", "load_inventory", "render_inventory_table"]

GROUP_KEYS = ("hosts", "children", "vars")
ALIASES = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_private_key_file": "ansible_ssh_private_key_file",
}
PRIORITY = "ansible_group_priority"
# Two declarations of one host that disagree on where to connect is a mistake worth stopping
# for; disagreeing playbook variables follow Ansible (the later one wins).
ADDRESS_VARS = (
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_connection",
)
CONNECTIONS: dict[str, Connection] = {
    "ssh": "ssh",
    "paramiko": "ssh",
    "paramiko_ssh": "ssh",
    "smart": "ssh",
    "local": "local",
}
TRUTHY = frozenset({"yes", "y", "true", "t", "on", "1"})
FALSY = frozenset({"no", "n", "false", "f", "off", "0"})
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NULL = "tag:yaml.org,2002:null"


# --- step 1: text -> groups, hosts and located variables -------------------------------------


@dataclass
class _Value:
    value: Any
    line: int | None = None
    column: int | None = None


@dataclass
class _Group:
    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    vars: dict[str, _Value] = field(default_factory=dict)


class _Builder:
    """Groups, hosts and variables as written, before any precedence is applied."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups: dict[str, _Group] = {"all": _Group("all"), "ungrouped": _Group("ungrouped")}
        self.hosts: dict[str, dict[str, _Value]] = {}

    def error(
        self, message: str, line: int | None, column: int | None, hint: str | None = None
    ) -> InventoryError:
        return InventoryError(message, path=self.path, line=line, column=column, hint=hint)

    def group(self, name: str, line: int | None, column: int | None) -> _Group:
        if not name or any(c.isspace() for c in name) or ":" in name:
            raise self.error(
                f"bad group name '{name}'",
                line,
                column,
                hint="group names are one word without ':', e.g. training",
            )
        return self.groups.setdefault(name, _Group(name))

    def add_child(self, parent: str, child: str, line: int | None, column: int | None) -> None:
        if child == "all":
            raise self.error(
                f"group 'all' cannot be a child of '{parent}'",
                line,
                column,
                hint="'all' holds every group already",
            )
        if child == parent or parent in self._descendants(child):
            raise self.error(
                f"group '{child}' would contain itself through '{parent}'",
                line,
                column,
                hint="remove one of the children: entries that form the loop",
            )
        self.group(child, line, column)
        if child not in self.groups[parent].children:
            self.groups[parent].children.append(child)
            self.groups[child].parents.append(parent)

    def _descendants(self, name: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[name].children) if name in self.groups else []
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.groups[current].children)
        return seen

    def add_hosts(
        self,
        group: str,
        pattern: str,
        variables: dict[str, _Value],
        line: int | None,
        column: int | None,
    ) -> None:
        pattern, port = self._split_port(pattern, line, column)
        if not pattern:
            raise self.error("empty host name", line, column, hint="give the host a name")
        try:
            names = ranges.expand(pattern)
        except ranges.RangeError as err:
            at = None if column is None else column + err.offset
            raise self.error(err.message, line, at, hint=err.hint) from None
        variables = _canonical(variables)
        if port is not None and "ansible_port" not in variables:
            variables["ansible_port"] = _Value(port, line, column)
        for name in names:
            known = self.hosts.setdefault(name, {})
            for key in ADDRESS_VARS:
                old, new = known.get(key), variables.get(key)
                if old is not None and new is not None and old.value != new.value:
                    raise self.error(
                        f"host '{name}' has {key} {_show(new.value)} here but "
                        f"{_show(old.value)} at line {old.line}",
                        new.line,
                        new.column,
                        hint="give each host its connection variables in one place",
                    )
            known.update(variables)
            if name not in self.groups[group].hosts:
                self.groups[group].hosts.append(name)

    def _split_port(
        self, pattern: str, line: int | None, column: int | None
    ) -> tuple[str, int | None]:
        """``gpu01:2222`` -> ('gpu01', 2222); a colon inside ``[...]`` is a range's."""
        outside = re.sub(r"\[[^\]]*\]", "", pattern)
        # An unclosed '[' is a broken range, not a port: leave it to ranges.expand to say so.
        if outside.count(":") != 1 or "[" in outside:
            return pattern, None
        head, _, tail = pattern.rpartition(":")
        if not tail.isdigit() or not 1 <= int(tail) <= 65535:
            raise self.error(
                f"host '{pattern}' has a bad port '{tail}'",
                line,
                column,
                hint="write name:PORT with PORT from 1 to 65535",
            )
        return head, int(tail)

    def variable_name(self, key: str, line: int | None, column: int | None) -> str:
        if not _VAR_NAME.match(key):
            fixed = re.sub(r"\W", "_", key)
            raise self.error(
                f"'{key}' is not a valid variable name",
                line,
                column,
                hint=f"use letters, digits and underscores, e.g. '{fixed}'",
            )
        return key


def _canonical(variables: dict[str, _Value]) -> dict[str, _Value]:
    """Aliases (``ansible_ssh_host`` ...) under their main name; the main name wins a tie."""
    out = {ALIASES.get(k, k): v for k, v in variables.items() if k in ALIASES}
    out.update({k: v for k, v in variables.items() if k not in ALIASES})
    return out


def _show(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)


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

    def __init__(self, builder: _Builder, loader: AnyLoader) -> None:
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

    def variables(self, node: yaml.Node, owner: str) -> dict[str, _Value]:
        out: dict[str, _Value] = {}
        for key, key_node, value_node in self.mapping(
            node, f"variables of {owner}", "write 'key: value' lines"
        ):
            mark = key_node.start_mark
            self.b.variable_name(key, mark.line + 1, mark.column + 1)
            out[key] = _Value(
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


def _read_yaml(text: str, builder: _Builder) -> None:
    loader: AnyLoader | None = None
    try:
        loader, root = _compose(text)
        if root is None:
            raise builder.error(
                "inventory file is empty", None, None, hint="add 'all:' with 'hosts:'"
            )
        _YamlReader(builder, loader).top(root)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or str(err)
        if err.context and not err.context.startswith("while"):
            problem = f"{err.context}, {problem}"
        raise builder.error(
            f"not valid YAML: {problem}",
            mark.line + 1 if mark else None,
            mark.column + 1 if mark else None,
            hint=_yaml_hint(err),
        ) from None
    except yaml.YAMLError as err:
        raise builder.error(f"not valid YAML: {err}", None, None) from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_hint(err: yaml.MarkedYAMLError) -> str:
    problem = err.problem or ""
    if "\\t" in problem or "\t" in problem:
        return "indent with spaces, not tabs"
    if "document" in problem:
        return "keep one document: remove the second '---'"
    opened = err.context_mark
    if err.context and "flow" in err.context and opened is not None:
        return f"close the '{{' or '[' opened at line {opened.line + 1}"
    return "check the indentation and the ':' after each name"


def _read_ini(text: str, builder: _Builder) -> None:
    sections = inventory_ini.parse_ini(text, builder.path)
    for section in sections:
        builder.group(section.group, section.line or None, 1 if section.line else None)
    for section in sections:
        if section.kind == "children":
            for item in section.items:
                builder.add_child(section.group, item.text, item.line, item.column)
        elif section.kind == "vars":
            for var in section.vars:
                builder.variable_name(var.key, var.line, var.column)
                builder.groups[section.group].vars[var.key] = _Value(
                    var.value, var.line, var.column
                )
        else:
            for item in section.items:
                variables: dict[str, _Value] = {}
                for var in item.vars:
                    builder.variable_name(var.key, var.line, var.column)
                    variables[var.key] = _Value(var.value, var.line, var.column)
                builder.add_hosts(section.group, item.text, variables, item.line, item.column)


# --- step 2: precedence ------------------------------------------------------------------


def _depths(builder: _Builder) -> dict[str, int]:
    """Longest path from ``all``: a group is as deep as its deepest parent plus one."""
    depths: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in depths:
            parents = builder.groups[name].parents or (["all"] if name != "all" else [])
            depths[name] = max((depth(p) + 1 for p in parents), default=0)
        return depths[name]

    for name in builder.groups:
        depth(name)
    return depths


def _priority(builder: _Builder, group: str) -> int:
    value = builder.groups[group].vars.get(PRIORITY)
    if value is None:
        return 1
    if (
        isinstance(value.value, bool)
        or not isinstance(value.value, (int, str))
        or not str(value.value).lstrip("-").isdigit()
    ):
        raise builder.error(
            f"{PRIORITY} of group '{group}' must be a whole number, got {_show(value.value)}",
            value.line,
            value.column,
            hint="e.g. ansible_group_priority: 10",
        )
    return int(value.value)


def _memberships(builder: _Builder) -> dict[str, set[str]]:
    """Host -> every group it is in, ancestors and ``all`` included."""
    out: dict[str, set[str]] = {name: {"all"} for name in builder.hosts}
    for group in builder.groups.values():
        for host in group.hosts:
            todo = [group.name]
            while todo:
                current = todo.pop()
                if current not in out[host]:
                    out[host].add(current)
                    todo.extend(builder.groups[current].parents)
    for groups in out.values():
        # Ansible: "ungrouped" holds exactly the hosts that are in no group but "all".
        groups.discard("ungrouped")
        if groups == {"all"}:
            groups.add("ungrouped")
    return out


def _effective(
    builder: _Builder, host: str, groups: set[str], depths: dict[str, int]
) -> dict[str, _Value]:
    order = sorted(groups, key=lambda g: (depths[g], _priority(builder, g), g))
    merged: dict[str, _Value] = {}
    for group in order:
        merged.update(_canonical(builder.groups[group].vars))
    merged.update(builder.hosts[host])
    return merged


# --- step 3: connection variables -> Host ------------------------------------------------


class _HostMaker:
    """Turns one host's effective variables into a Host, reading ssh configs once each."""

    def __init__(self, path: str, ssh_config: str | None) -> None:
        self.path = path
        self.default_config = ssh_config
        self.configs: dict[str, paramiko.SSHConfig] = {}

    def error(self, key: str, values: dict[str, _Value], message: str, hint: str) -> InventoryError:
        where = values[key]
        return InventoryError(
            message, path=self.path, line=where.line, column=where.column, hint=hint
        )

    def text(self, key: str, values: dict[str, _Value]) -> str | None:
        value = values[key].value if key in values else None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(
                key,
                values,
                f"{key} must be text, got {_show(value)}",
                f"write {key}: VALUE on one line",
            )
        if str(value) == "":
            raise self.error(key, values, f"{key} is empty", f"give a value or remove {key}")
        return str(value)

    def port(self, values: dict[str, _Value]) -> int | None:
        value = values["ansible_port"].value if "ansible_port" in values else None
        if value is None:
            return None
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and value.strip().isdigit():
            number = int(value)
        if number is None or not 1 <= number <= 65535:
            raise self.error(
                "ansible_port",
                values,
                f"ansible_port must be a whole number from 1 to 65535, got {_show(value)}",
                "e.g. ansible_port: 22",
            )
        return number

    def connection(self, values: dict[str, _Value]) -> Connection:
        value = self.text("ansible_connection", values) or "ssh"
        if value.lower() not in CONNECTIONS:
            raise self.error(
                "ansible_connection",
                values,
                f"ansible_connection '{value}' is not supported",
                "use 'ssh' or 'local'",
            )
        return CONNECTIONS[value.lower()]

    def become(self, values: dict[str, _Value]) -> bool:
        value = values["ansible_become"].value if "ansible_become" in values else None
        if value is None:
            return False
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
        if text in TRUTHY or text in FALSY:
            return text in TRUTHY
        raise self.error(
            "ansible_become",
            values,
            f"ansible_become must be yes/no/true/false, got {_show(value)}",
            "e.g. ansible_become: yes",
        )

    def ssh_args(self, values: dict[str, _Value]) -> sshconfig.SshArgs:
        options: dict[str, str] = {}
        proxy_jump: str | None = None
        config_file: str | None = None
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            text = self.text(key, values)
            if text is None:
                continue
            try:
                args = sshconfig.parse_ssh_args(text)
            except sshconfig.SshArgsError as err:
                raise self.error(key, values, f"{key}: {err.message}", err.hint or "") from None
            options.update(args.options)
            proxy_jump = args.proxy_jump or proxy_jump
            config_file = args.config_file or config_file
        return sshconfig.SshArgs(options, proxy_jump, config_file)

    def config(
        self, values: dict[str, _Value], args: sshconfig.SshArgs
    ) -> tuple[paramiko.SSHConfig | None, str | None]:
        path = self.default_config
        if args.config_file is not None:
            # Relative to the inventory, so an inventory and its ssh config travel together.
            path = os.path.join(os.path.dirname(self.path), os.path.expanduser(args.config_file))
            if not os.path.isfile(path):
                key = next(
                    k
                    for k in ("ansible_ssh_extra_args", "ansible_ssh_common_args")
                    if k in values and "-F" in str(values[k].value)
                )
                raise self.error(
                    key,
                    values,
                    f"ssh config file '{path}' given by -F does not exist",
                    "fix the -F path or remove it",
                )
        if path is None:
            return None, None
        if path not in self.configs:
            self.configs[path] = sshconfig.load_config(path)
        return self.configs[path], path

    def make(self, name: str, values: dict[str, _Value], groups: set[str]) -> Host:
        connection = self.connection(values)
        args = self.ssh_args(values)
        key = self.text("ansible_ssh_private_key_file", values)
        config, config_path = (None, None) if connection == "local" else self.config(values, args)
        settings = sshconfig.merge(
            name,
            host=self.text("ansible_host", values),
            port=self.port(values),
            user=self.text("ansible_user", values),
            key=os.path.expanduser(key) if key else None,
            proxy_jump=args.proxy_jump,
            options=args.options,
            config=config,
            config_path=config_path,
        )
        return Host(
            name=name,
            address=settings.address,
            port=settings.port,
            user=settings.user,
            key=settings.key,
            connection=connection,
            become=self.become(values),
            become_user=self.text("ansible_become_user", values),
            groups=tuple(sorted(groups - {"all"})),
            vars={
                # Every ansible_* name is Ansible's (passwords among them): never a
                # playbook variable, never printed by `inventory --json` or in a script.
                k: v.value for k, v in values.items() if not k.startswith("ansible_")
            },
            proxy_jump=settings.proxy_jump,
            ssh_options=settings.options,
            ssh_config=config_path,
        )


# --- the public surface ------------------------------------------------------------------


@dataclass(frozen=True)
class Inventory:
    """Every host of one inventory file, in file order, and every group's hosts."""

    path: str
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]]

    def select(self, limit: str | None) -> list[Host]:
        """Hosts a ``--limit`` pattern selects (see :mod:`fleetclean.limit`), file order.

        Raises ``InventoryError`` naming the pattern when it selects nothing.
        """
        names = select_names(limit, list(self.hosts), self.groups, source=self.path)
        return [self.hosts[name] for name in names]


def load_inventory(
    path: str | os.PathLike[str], *, ssh_config: str | os.PathLike[str] | None = None
) -> Inventory:
    """Read a YAML or INI inventory; ``ssh_config`` None means ``~/.ssh/config`` if present.

    ``$FLEETCLEAN_SSH_CONFIG`` replaces that default; an empty value (env or argument) reads
    no ssh config at all. A given config file that is missing is an error.
    ``.yml``/``.yaml``/``.json`` files are YAML, ``.ini`` files INI, others are told apart
    by their first line. Every problem is one ``InventoryError``: file, line, column, fix.
    """
    source = os.fspath(path)
    text = _read_text(source)
    builder = _Builder(source)
    if not text.strip():
        raise builder.error("inventory file is empty", None, None, hint="add 'all:' with 'hosts:'")
    extension = os.path.splitext(source)[1].lower()
    if extension in (".yml", ".yaml", ".json"):
        _read_yaml(text, builder)
    elif extension == ".ini" or inventory_ini.looks_like_ini(text):
        _read_ini(text, builder)
    else:
        _read_yaml(text, builder)
    if not builder.hosts:
        raise builder.error(
            "inventory defines no hosts",
            None,
            None,
            hint="list hosts under a group's 'hosts:' in YAML or in a [group] section in INI",
        )
    # An empty string (e.g. FLEETCLEAN_SSH_CONFIG= passed through) means: read no ssh config.
    config = os.fspath(ssh_config) if ssh_config is not None else sshconfig.default_config_path()
    config = config or None
    if config is not None and not os.path.isfile(config):
        sshconfig.load_config(config)  # raises the missing-file error with its path
    return _resolve(builder, config)


def _read_text(path: str) -> str:
    if os.path.isdir(path):
        raise InventoryError(
            "is a directory, not an inventory file",
            path=path,
            hint="give the inventory file inside it, e.g. -i inventories/lab.yml",
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise InventoryError(
            "inventory file does not exist", path=path, hint="check the path given to -i"
        ) from None
    except OSError as err:
        raise InventoryError(
            f"cannot read inventory file: {err.strerror}",
            path=path,
            hint="check that it is a readable file",
        ) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InventoryError(
            f"not UTF-8 text (byte 0x{data[err.start]:02x})",
            path=path,
            line=line,
            column=column,
            hint="save the file as UTF-8",
        ) from None


def _resolve(builder: _Builder, ssh_config: str | None) -> Inventory:
    depths = _depths(builder)
    memberships = _memberships(builder)
    maker = _HostMaker(builder.path, ssh_config)
    hosts = {
        name: maker.make(name, _effective(builder, name, groups, depths), groups)
        for name, groups in memberships.items()
    }
    names = ["all", *(g for g in builder.groups if g not in ("all", "ungrouped")), "ungrouped"]
    groups = {group: tuple(h for h in hosts if group in memberships[h]) for group in names}
    return Inventory(path=builder.path, hosts=hosts, groups=groups)


def inventory_json(hosts: list[Host]) -> dict[str, Any]:
    """``fleetclean inventory --json``: the DESIGN.md contract, values made JSON-safe."""
    return {
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "port": h.port,
                "user": h.user,
                "key": h.key,
                "connection": h.connection,
                "become": h.become,
                "groups": list(h.groups),
                "vars": _plain(h.vars),
            }
            for h in hosts
        ]
    }


def _plain(value: Any) -> Any:
    """YAML and INI can give dates, sets, bytes, NaN: write them as JSON can."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=str)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def render_inventory_table(hosts: list[Host]) -> RenderableType:
    """The human ``fleetclean inventory`` view: one row per host with where and how to
    connect, then the playbook variables: those every host shares once, the others once per
    set of hosts that has them (``h200-[01-07].lab: grace=10``), so that 80 columns suffice.
    Columns empty for every host are left out.
    """
    from fleetclean.nodeset import fold

    shared = {
        k: v for k, v in (hosts[0].vars.items() if hosts else ())
        if all(k in h.vars and h.vars[k] == v for h in hosts)
    }
    rows = [{
        "host": h.name,
        "address": f"{h.address}:{h.port}",
        "user": h.user or "",
        "via": "local" if h.connection == "local" else (h.proxy_jump or ""),
        "become": (h.become_user or "root") if h.become else "",
        "groups": ",".join(h.groups),
    } for h in hosts]
    table = Table(
        title=f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    columns = [c for c in rows[0] if c == "host" or any(r[c] for r in rows)] if rows else []
    for column in columns:
        table.add_column(column, no_wrap=True)
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    lines: list[RenderableType] = [table]
    if shared:
        lines.append(Text("vars, every host: " + _vars_text(shared)))
    by_vars: dict[str, list[str]] = {}
    for h in hosts:
        own = _vars_text({k: v for k, v in h.vars.items() if k not in shared})
        if own:
            by_vars.setdefault(own, []).append(h.name)
    for text, names in by_vars.items():
        lines.append(Text(f"vars, {fold(names)}: {text}"))
    return Group(*lines)


def _vars_text(variables: dict[str, Any]) -> str:
    return " ".join(f"{k}={_var_text(v)}" for k, v in variables.items())


def _var_text(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)
