"""Ansible's INI inventory format -> sections of hosts, children and variables.

:func:`parse_ini` reads the text; :func:`read_ini` feeds the sections to a
:class:`~fleetclean.inventory.builder.Builder`, which expands ranges as it does for YAML.

- ``[group]`` lists hosts, one a line: ``name [key=value ...]``; ``name:port`` sets the port.
- ``[group:children]`` lists child groups; ``[group:vars]`` holds ``key=value`` lines.
- Hosts above the first section belong to ``ungrouped``; ``#`` and ``;`` start comments.
- Values are read as Python literals when they are one (``22`` -> 22, ``['a']`` -> a list),
  else kept as strings. Ansible does this for host lines only and keeps ``[group:vars]``
  values as strings; fleetclean reads both the same way so that an INI file and its YAML
  twin give the same variables (``max_used_mib=1024`` is the number 1024 in both).

>>> first, gpus = parse_ini("gpu00\\n[gpus]\\ngpu[01:02] ansible_user=root\\n", "hosts")
>>> first.group, [h.text for h in first.items]
('ungrouped', ['gpu00'])
>>> gpus.group, gpus.kind, [(h.text, h.vars[0].key, h.vars[0].value) for h in gpus.items]
('gpus', 'hosts', [('gpu[01:02]', 'ansible_user', 'root')])
>>> parse_ini("[gpus:chidren]\\nh200\\n", "hosts")
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: hosts:1:1: unknown section type ':chidren' (did you mean ...)
"""

from __future__ import annotations

import ast
import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from fleetclean.errors import InventoryError
from fleetclean.inventory.builder import Builder, Value

__all__ = [
    "IniItem",
    "IniSection",
    "IniVar",
    "looks_like_ini",
    "parse_ini",
    "parse_value",
    "read_ini",
]

SectionKind = Literal["hosts", "children", "vars"]

_SECTION = re.compile(r"^\[(?P<name>[^\]]*)\]\s*(?:[#;].*)?$")


@dataclass
class IniVar:
    key: str
    value: Any
    line: int
    column: int


@dataclass
class IniItem:
    """A host pattern or a child group name, where it was written, and inline variables."""

    text: str
    line: int
    column: int
    vars: list[IniVar] = field(default_factory=list)


@dataclass
class IniSection:
    group: str
    kind: SectionKind
    line: int
    items: list[IniItem] = field(default_factory=list)
    vars: list[IniVar] = field(default_factory=list)


def looks_like_ini(text: str) -> bool:
    """True when the first line that says anything is an INI ``[section]`` or a bare host."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if _SECTION.match(line):
            return True
        # "all:" or "key: value" is YAML; "gpu01 ansible_host=..." or "gpu01" is INI.
        return not re.match(r"^[^\s=]+:(\s|$)", line) and not line.startswith(("---", "{"))
    return False


def parse_value(text: str) -> Any:
    """A Python literal if ``text`` is one, else ``text`` itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_ini(text: str, path: str) -> list[IniSection]:
    """Sections in file order; a repeated section comes back twice, to be merged later."""
    sections: list[IniSection] = [IniSection("ungrouped", "hosts", 0)]
    declared = {"all", "ungrouped"}
    pending: list[tuple[str, str, int, int]] = []  # (group, why, line, column) to check
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        column = len(raw) - len(raw.lstrip()) + 1
        header = _SECTION.match(line)
        if header:
            section = _section(header["name"].strip(), path, number, column)
            sections.append(section)
            if section.kind == "vars":
                pending.append((section.group, "vars", number, column))
            else:
                declared.add(section.group)
            continue
        section = sections[-1]
        if section.kind == "vars":
            section.vars.append(_var(line, raw, path, number))
        elif section.kind == "children":
            words = _split(line, path, number, column)
            if len(words) != 1:
                raise InventoryError(
                    f"[{section.group}:children] lists one group a line, got '{line}'",
                    path=path,
                    line=number,
                    column=column,
                    hint="put each child group on its own line",
                )
            section.items.append(IniItem(words[0], number, column))
            pending.append((words[0], "child", number, column))
        else:
            section.items.append(_host(line, raw, path, number, column))
    for group, why, number, column in pending:
        if group not in declared:
            raise InventoryError(
                f"group '{group}' is never defined"
                + (" but has a [vars] section" if why == "vars" else " but is listed as a child"),
                path=path,
                line=number,
                column=column,
                hint=f"add a [{group}] section, even an empty one",
            )
    return sections


def _section(name: str, path: str, number: int, column: int) -> IniSection:
    group, sep, suffix = name.rpartition(":")
    kind: SectionKind = "hosts"
    if not sep:
        group = name
    elif suffix == "vars":
        kind = "vars"
    elif suffix == "children":
        kind = "children"
    else:
        close = difflib.get_close_matches(suffix, ["vars", "children"], n=1)
        hint = (
            f"did you mean ':{close[0]}'?"
            if close
            else "use [group], [group:vars] or [group:children]"
        )
        raise InventoryError(
            f"unknown section type ':{suffix}'", path=path, line=number, column=column, hint=hint
        )
    if not group or any(c.isspace() for c in group):
        raise InventoryError(
            f"bad group name '{group}' in section [{name}]",
            path=path,
            line=number,
            column=column,
            hint="group names are one word, e.g. [training]",
        )
    return IniSection(group, kind, number)


def _split(line: str, path: str, number: int, column: int) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError as err:
        raise InventoryError(
            f"cannot read line: {err}",
            path=path,
            line=number,
            column=column,
            hint="close the quote",
        ) from None


def _host(line: str, raw: str, path: str, number: int, column: int) -> IniItem:
    words = _split(line, path, number, column)
    item = IniItem(words[0], number, column)
    for word in words[1:]:
        key, sep, value = word.partition("=")
        at = raw.find(key) + 1 if key else column
        if not sep or not key:
            raise InventoryError(
                f"expected key=value after host '{words[0]}', got '{word}'",
                path=path,
                line=number,
                column=at,
                hint="write variables as key=value, quoting values with spaces",
            )
        item.vars.append(IniVar(key, parse_value(value), number, at))
    return item


def _var(line: str, raw: str, path: str, number: int) -> IniVar:
    key, sep, value = line.partition("=")
    key, value = key.strip(), value.strip()
    column = raw.find(key) + 1 if key else 1
    if not sep or not key:
        raise InventoryError(
            f"expected key=value, got '{line}'",
            path=path,
            line=number,
            column=column,
            hint="a [group:vars] section holds key=value lines",
        )
    # The rest of the line is the value, as in Ansible: a Python literal ('quoted text',
    # [lists], numbers; a trailing comment is fine there), else plain text up to a comment.
    parsed = parse_value(value)
    if parsed is value:
        parsed = re.split(r"\s+[#;]", value, maxsplit=1)[0]
    return IniVar(key, parsed, number, column)


def read_ini(text: str, builder: Builder) -> None:
    """Feed the sections of INI ``text`` to ``builder``: groups first, so children can name
    groups defined further down."""
    sections = parse_ini(text, builder.path)
    for section in sections:
        builder.group(section.group, section.line or None, 1 if section.line else None)
    for section in sections:
        if section.kind == "children":
            for item in section.items:
                builder.add_child(section.group, item.text, item.line, item.column)
        elif section.kind == "vars":
            for var in section.vars:
                builder.variable_name(var.key, var.line, var.column)
                builder.groups[section.group].vars[var.key] = builder.located(
                    var.value, var.line, var.column
                )
        else:
            for item in section.items:
                variables: dict[str, Value] = {}
                for var in item.vars:
                    builder.variable_name(var.key, var.line, var.column)
                    variables[var.key] = builder.located(var.value, var.line, var.column)
                builder.add_hosts(section.group, item.text, variables, item.line, item.column)

