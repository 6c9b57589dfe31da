"""Groups, hosts and variables as an inventory source wrote them, before any precedence.

Each reader (:mod:`.yaml_file`, :mod:`.ini_file`, :mod:`.inline`) feeds one :class:`Builder`;
every value keeps the line and column it came from, so that :mod:`.build` can name them in
its errors. The builder checks what is wrong whatever the syntax: bad group names, groups
that contain themselves, a host whose address is given twice differently.

>>> b = Builder("lab.yml")
>>> b.add_hosts("all", "gpu[01:02]:2222", {}, 3, 5)
>>> sorted(b.hosts), b.hosts["gpu01"]["ansible_port"].value
(['gpu01', 'gpu02'], 2222)
>>> b.add_child("all", "all", 4, 5)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: lab.yml:4:5: group 'all' cannot be a child of 'all' ('all' ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fleetclean.errors import InventoryError
from fleetclean.inventory import ranges

__all__ = ["ADDRESS_VARS", "Builder", "Group", "Value", "canonical", "show"]

ALIASES = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_private_key_file": "ansible_ssh_private_key_file",
    "ansible_become_pass": "ansible_become_password",
    "ansible_sudo_pass": "ansible_become_password",  # after become_pass: it wins over both
}
# Which of the two names Ansible takes where both are set, at any level: its plugins list
# each setting's variables in order and the last one set wins (the config manager's
# _loop_entries). ssh's host, port and user list the ansible_ssh_* name last, the key
# file ansible_ssh_private_key_file, sudo's password ansible_become_pass (after
# ansible_become_password, and ansible_sudo_pass after both). A name set to null counts as
# unset there (a null ansible_ssh_user leaves ansible_user as it is). So group_vars/all's
# `ansible_ssh_user: deploy` beats a host's own `ansible_user: root` in Ansible, and here:
# "A connection-specific version of a variable takes precedence over more generic
# versions" (Ansible's user guide, Using variables; ansible/ansible#69124 keeps that
# example; ansible-core 2.21's _loop_entries still takes the last one set).
ALIAS_WINS = {
    "ansible_ssh_host": True,
    "ansible_ssh_port": True,
    "ansible_ssh_user": True,
    "ansible_private_key_file": False,
    "ansible_become_pass": True,
    "ansible_sudo_pass": True,
}
# Two declarations of one host that disagree on where to connect is a mistake worth stopping
# for; disagreeing playbook variables follow Ansible (the later one wins).
ADDRESS_VARS = (
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_private_key_file",
    "ansible_connection",
)
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Value:
    """One variable's value and where it was written (None: not from a file's line);
    ``base``: the directory a relative path in it is read from, where that is not its own
    file's (a group_vars/ file's value is its inventory's, see :mod:`.vars_dirs`)."""

    value: Any
    line: int | None = None
    column: int | None = None
    path: str | None = None
    base: str | None = field(default=None, repr=False)


@dataclass
class Group:
    name: str
    hosts: list[str] = field(default_factory=list)
    # The same names as a set: a membership test per host added was a scan of the list,
    # 6.4 s for a range of 20,000 hosts.
    members: set[str] = field(default_factory=set)
    children: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    vars: dict[str, Value] = field(default_factory=dict)


class Builder:
    """Groups, hosts and variables as written, before any precedence is applied."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups: dict[str, Group] = {"all": Group("all"), "ungrouped": Group("ungrouped")}
        self.hosts: dict[str, dict[str, Value]] = {}

    def error(
        self, message: str, line: int | None, column: int | None, hint: str | None = None
    ) -> InventoryError:
        return InventoryError(message, path=self.path, line=line, column=column, hint=hint)

    def located(self, value: Any, line: int | None, column: int | None) -> Value:
        """``value`` as written at line:column of the source being read now."""
        return Value(value, line, column, self.path)

    def group(self, name: str, line: int | None, column: int | None) -> Group:
        if not name or any(c.isspace() for c in name) or ":" in name:
            raise self.error(
                f"bad group name '{name}'",
                line,
                column,
                hint="group names are one word without ':', e.g. training",
            )
        return self.groups.setdefault(name, Group(name))

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
        variables: dict[str, Value],
        line: int | None,
        column: int | None,
    ) -> None:
        pattern, port = self._split_port(pattern, line, column)
        user, sep, bare = pattern.rpartition("@")
        if sep and user and bare:
            # user@host, as ssh and pdsh take it (Ansible passes it on to ssh): the host is
            # named without its user, which becomes its ansible_user unless one is given.
            pattern = bare
        else:
            user = ""
        if not pattern:
            raise self.error("empty host name", line, column, hint="give the host a name")
        self._check_name(pattern, line, column)
        try:
            names = ranges.expand(pattern)
        except ranges.RangeError as err:
            at = None if column is None else column + err.offset
            raise self.error(err.message, line, at, hint=err.hint) from None
        # Kept under the names given: the aliases are resolved once a host's levels are
        # merged (build._effective), as Ansible picks among them.
        variables = dict(variables)
        given = canonical(variables)
        if user and "ansible_user" not in given:
            variables["ansible_user"] = self.located(user, line, column)
        if port is not None and "ansible_port" not in given:
            variables["ansible_port"] = self.located(port, line, column)
        given = canonical(variables)
        for name in names:
            known = self.hosts.setdefault(name, {})
            before = canonical(known)
            for key in ADDRESS_VARS:
                old, new = before.get(key), given.get(key)
                # Across sources (-i a.yml -i b.yml) the later one wins, as in Ansible.
                if old and new and old.path == new.path and old.value != new.value:
                    raise self.error(
                        f"host '{name}' has {key} {show(new.value)} here but "
                        f"{show(old.value)} at line {old.line}",
                        new.line,
                        new.column,
                        hint="give each host its connection variables in one place",
                    )
            known.update(variables)
            members = self.groups[group]
            if name not in members.members:
                members.members.add(name)
                members.hosts.append(name)

    def _check_name(self, pattern: str, line: int | None, column: int | None) -> None:
        """A host name holds no '@' (user@host is split before), '=', blank or control
        character: each is another thing written where a name goes (a variable before
        any [section] of an INI file, or under [group] instead of [group:vars]), which was
        taken for a host and failed only when SSH could not resolve it."""
        if "@" in pattern:
            raise self.error(f"host '{pattern}' has an '@' but no user or host around it",
                             line, column, hint="write user@host, or the host alone")
        if "=" in pattern:
            raise self.error(f"'{pattern}' is a variable where a host name goes", line,
                             column, hint="put variables after a host on its line, or under "
                                          "[GROUP:vars] (in YAML, under vars:)")
        if any(c.isspace() or not c.isprintable() for c in pattern):
            raise self.error(f"host name {pattern!r} has a blank or control character", line,
                             column, hint="write one host name a line, without blanks")

    def _split_port(
        self, pattern: str, line: int | None, column: int | None
    ) -> tuple[str, int | None]:
        """``gpu01:2222`` -> ('gpu01', 2222); a colon inside ``[...]`` is a range's."""
        outside = re.sub(r"\[[^\]]*\]", "", pattern)
        # An unclosed '[' is a broken range, not a port: leave it to ranges.expand to say so.
        if outside.count(":") != 1 or "[" in outside:
            return pattern, None
        head, _, tail = pattern.rpartition(":")
        port = port_number(tail)
        if port is None:
            raise self.error(
                f"host '{pattern}' has a bad port '{tail}'",
                line,
                column,
                hint="write name:PORT with PORT from 1 to 65535",
            )
        return head, port

    def variable_name(self, key: str, line: int | None, column: int | None) -> str:
        if not valid_name(key):
            fixed = re.sub(r"\W", "_", key)
            raise self.error(
                f"'{key}' is not a valid variable name",
                line,
                column,
                hint=f"use letters, digits and underscores, e.g. '{fixed}'",
            )
        return key


def port_number(text: str) -> int | None:
    """``text`` as a TCP port (ASCII digits, 1 to 65535), or None. ``str.isdigit`` alone also
    takes "²", which ``int`` then refuses with a traceback."""
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    return None


def valid_name(key: str) -> bool:
    """Whether ``key`` can name a variable (letters, digits, underscores; no digit first)."""
    return bool(_VAR_NAME.match(key))


def canonical(variables: dict[str, Value]) -> dict[str, Value]:
    """Aliases (``ansible_ssh_host`` ...) under their main name, where both are set the one
    Ansible takes (``ALIAS_WINS``). Applied to a host's variables once every level is
    merged, each name on its own, as Ansible merges them.

    >>> v = canonical({"ansible_user": Value("root"), "ansible_ssh_user": Value("deploy"),
    ...                "ansible_private_key_file": Value("/a"),
    ...                "ansible_ssh_private_key_file": Value("/b")})
    >>> v["ansible_user"].value, v["ansible_ssh_private_key_file"].value, sorted(v)
    ('deploy', '/b', ['ansible_ssh_private_key_file', 'ansible_user'])
    """
    out = {k: v for k, v in variables.items() if k not in ALIASES}
    for alias, main in ALIASES.items():
        given = variables.get(alias)
        if given is None or (given.value is None and main in out):
            continue  # Ansible skips a null: the other name decides
        mine = out.get(main)
        if ALIAS_WINS[alias] or mine is None or mine.value is None:
            out[main] = given
    return out


def show(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)

