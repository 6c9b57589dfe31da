"""Precedence and Host building: a :class:`~fleetclean.inventory.builder.Builder` -> hosts.

- precedence, as Ansible documents it: ``all`` < parent groups < child groups < host, and
  among groups of one depth ``ansible_group_priority`` (default 1) then the group name
  (alphabetical, the later name wins). Files beside the inventory (:mod:`.vars_dirs`) come
  in as Ansible's list has them: every group's inventory vars < ``group_vars/all`` <
  ``group_vars/`` of the other groups (same order) < the host's inventory vars <
  ``host_vars/``, so that ``group_vars/all.yml`` wins over a child group's inventory vars;
- connection variables -> Host fields, with ``~/.ssh/config`` filling what the inventory
  leaves open (:mod:`.ssh_settings`). Every other variable is a playbook variable and lands
  in ``Host.vars``.

``Host.groups`` is Ansible's ``group_names``: every group the host is in, parents included,
sorted, without ``all``; a host in no group but ``all`` is in ``ungrouped``, as in Ansible.

>>> from fleetclean.inventory.builder import Builder, Value
>>> b = Builder("lab.yml")
>>> b.add_hosts("all", "gpu01", {"ansible_user": Value("root", 2, 12)}, 2, 5)
>>> b.groups["all"].vars["grace"] = Value(10, 1, 1)
>>> host = resolve(b, ssh_config=None).hosts["gpu01"]
>>> host.address, host.port, host.user, host.groups, host.vars
('gpu01', 22, 'root', ('ungrouped',), {'grace': 10})
>>> b.groups["all"].vars["ansible_become"] = Value("maybe", 1, 16)
>>> resolve(b, ssh_config=None)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: lab.yml:1:16: ansible_become must be yes/no/true/false, ...
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetclean.errors import InventoryError
from fleetclean.inventory import ssh_settings
from fleetclean.inventory.builder import Builder, Value, canonical, port_number, show
from fleetclean.inventory.limit import select_names
from fleetclean.inventory.templates import Unrendered, is_template, render
from fleetclean.inventory.vars_dirs import DirVars, VarsDirs
from fleetclean.models import Connection, Host, Secret

if TYPE_CHECKING:
    from fleetclean.transport.upstream import SSHConfig

__all__ = ["Inventory", "resolve"]

PRIORITY = "ansible_group_priority"
CONNECTIONS: dict[str, Connection] = {
    "ssh": "ssh",
    "paramiko": "ssh",
    "paramiko_ssh": "ssh",
    "smart": "ssh",
    "local": "local",
}
TRUTHY = frozenset({"yes", "y", "true", "t", "on", "1"})
FALSY = frozenset({"no", "n", "false", "f", "off", "0"})


def _depths(builder: Builder) -> dict[str, int]:
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


def _priority(builder: Builder, group: str) -> int:
    value = builder.groups[group].vars.get(PRIORITY)
    if value is None:
        return 1
    if (
        isinstance(value.value, bool)
        or not isinstance(value.value, (int, str))
        or not str(value.value).lstrip("-").isdigit()
    ):
        raise InventoryError(
            f"{PRIORITY} of group '{group}' must be a whole number, got {show(value.value)}",
            path=value.path or builder.path,
            line=value.line,
            column=value.column,
            hint="e.g. ansible_group_priority: 10",
        )
    return int(value.value)


def _memberships(builder: Builder) -> dict[str, set[str]]:
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
    builder: Builder, host: str, groups: set[str], depths: dict[str, int],
    defaults: dict[str, Value], *, dirs: Sequence[DirVars] = (),
) -> dict[str, Value]:
    order = sorted(groups, key=lambda g: (depths[g], _priority(builder, g), g))
    # Command-line options (-b, --become-user) lose to every variable, as in Ansible.
    merged: dict[str, Value] = dict(defaults)
    for group in order:
        merged.update(builder.groups[group].vars)
    # group_vars/ files win over every group's inventory vars, all's first, then the
    # others in the same order; each kind over the -i files in turn (a later one wins),
    # as Ansible runs its vars plugins per inventory source.
    for source in dirs:
        merged.update(source.groups.get("all", {}))
    for source in dirs:
        for group in order:
            if group != "all":
                merged.update(source.groups.get(group, {}))
    merged.update(builder.hosts[host])
    for source in dirs:
        merged.update(source.hosts.get(host, {}))
    # Each alias merged on its own, then the one Ansible takes (builder.ALIAS_WINS).
    return canonical(merged)


# --- step 3: connection variables -> Host ------------------------------------------------


# The variables a host's connection is made of (by their main names, aliases resolved):
# a template in one of these is said; in any other ansible_* (ansible_python_interpreter),
# which fleetclean never reads, it is not.
CONNECTION_VARS = frozenset({
    "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_connection",
    "ansible_become", "ansible_become_user", "ansible_become_password",
    "ansible_become_method",
})


# Connection variables whose template fleetclean does not render stop the run (exit 4),
# where the others are left unset, said: left unset, the default for one of these is
# another machine (the inventory name, port 22) or other rights (no become, or root).
_NEVER_GUESSED = frozenset({"ansible_host", "ansible_port", "ansible_connection",
                            "ansible_become", "ansible_become_user", "ansible_become_method"})

# Stands for a variable a password's template read (see _HostMaker.untemplated).
_SECRET = object()


class _HostMaker:
    """Turns one host's effective variables into a Host, reading ssh configs once each."""

    def __init__(self, path: str, ssh_config: str | None, system_after: bool) -> None:
        self.path = path
        self.default_config = ssh_config
        self.system_after = system_after  # the run named no config: ssh's system one too
        self.configs: dict[tuple[str, bool], SSHConfig] = {}
        # Each distinct ansible_ssh_*_args text split once: a fleet's hosts share theirs
        # (group vars), and shlex costs 56 us a host (never changed after: merge copies).
        self.parsed: dict[str, ssh_settings.SshArgs] = {}
        self.warnings: dict[str, str] = {}  # file -> warning about it

    def error(self, key: str, values: dict[str, Value], message: str, hint: str) -> InventoryError:
        where = values[key]
        return InventoryError(
            message, path=where.path or self.path, line=where.line, column=where.column, hint=hint
        )

    def text(self, key: str, values: dict[str, Value]) -> str | None:
        value = values[key].value if key in values else None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(
                key,
                values,
                f"{key} must be text, got {show(value)}",
                f"write {key}: VALUE on one line",
            )
        if str(value) == "":
            raise self.error(key, values, f"{key} is empty", f"give a value or remove {key}")
        return str(value)

    def port(self, values: dict[str, Value]) -> int | None:
        value = values["ansible_port"].value if "ansible_port" in values else None
        if value is None:
            return None
        number = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str):
            number = port_number(value.strip())
        if number is None or not 1 <= number <= 65535:
            raise self.error(
                "ansible_port",
                values,
                f"ansible_port must be a whole number from 1 to 65535, got {show(value)}",
                "e.g. ansible_port: 22",
            )
        return number

    def connection(self, values: dict[str, Value]) -> Connection:
        value = self.text("ansible_connection", values) or "ssh"
        if value.lower() not in CONNECTIONS:
            raise self.error(
                "ansible_connection",
                values,
                f"ansible_connection '{value}' is not supported",
                "use 'ssh' or 'local'",
            )
        return CONNECTIONS[value.lower()]

    def become(self, values: dict[str, Value]) -> bool:
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
            f"ansible_become must be yes/no/true/false, got {show(value)}",
            "e.g. ansible_become: yes",
        )

    def become_method(self, values: dict[str, Value]) -> None:
        method = self.text("ansible_become_method", values)
        if method is not None and method.lower() != "sudo":
            raise self.error(
                "ansible_become_method",
                values,
                f"ansible_become_method '{method}' is not supported",
                "fleetclean becomes root through sudo only: write sudo or remove the line",
            )

    def become_password(self, values: dict[str, Value]) -> Secret | None:
        """The password, never shown in an error; a warning when its file is readable by
        others than its owner."""
        key = "ansible_become_password"
        if key not in values or values[key].value is None:
            return None
        value = values[key].value
        if isinstance(value, Secret):
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.error(key, values, f"{key} must be text", f"write {key}: 'PASSWORD'")
        text = str(value)
        if not text or any(c in text for c in "\n\r\0"):
            raise self.error(key, values, f"{key} is empty or holds a line break",
                             "sudo reads one line: give the password on one line")
        self.check_private(values[key].path or self.path)
        return Secret(text)

    def check_private(self, path: str) -> None:
        try:
            mode = os.stat(path).st_mode
        except OSError:  # an inline host list: no file
            return
        if mode & 0o044 and path not in self.warnings:
            self.warnings[path] = (
                f"{path} holds ansible_become_password and is readable by others than its "
                f"owner (mode {mode & 0o777:04o}); chmod 600 {path}"
            )

    def ssh_args(self, values: dict[str, Value]) -> ssh_settings.SshArgs:
        merged = ssh_settings.SshArgs()
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            text = self.text(key, values)
            if text is None:
                continue
            args = self.parsed.get(text)
            if args is None:
                try:
                    args = self.parsed[text] = ssh_settings.parse_ssh_args(text)
                except ssh_settings.SshArgsError as err:
                    raise self.error(key, values, f"{key}: {err.message}",
                                     err.hint or "") from None
            merged = merged.then(args)  # Ansible writes the common args before the extra
        return merged

    def config(
        self, values: dict[str, Value], args: ssh_settings.SshArgs
    ) -> tuple[SSHConfig | None, str | None, bool]:
        """The host's ssh config, its path, and whether ssh's system-wide one is read
        after it: not where -F names the file (ssh reads that one alone)."""
        path = self.default_config
        system_after = self.system_after
        if args.config_file is not None:
            system_after = False
            key = next(
                k
                for k in ("ansible_ssh_extra_args", "ansible_ssh_common_args")
                if k in values and "-F" in str(values[k].value)
            )
            # Relative to the inventory that gave it, so an inventory and its ssh config
            # travel together (a group_vars/ file's value: relative to its inventory too).
            given = values[key]
            base = given.base or os.path.dirname(given.path or self.path)
            path = os.path.join(base, os.path.expanduser(args.config_file))
            if not os.path.isfile(path):
                raise self.error(
                    key,
                    values,
                    f"ssh config file '{path}' given by -F does not exist",
                    "fix the -F path or remove it",
                )
        if path is None:
            return None, None, False
        if (path, system_after) not in self.configs:
            said: list[str] = []
            self.configs[path, system_after] = ssh_settings.load_config(
                path, system_after=system_after, said=said)
            self.warnings.update({line: line for line in said})
        return self.configs[path, system_after], path, system_after

    def untemplated(self, name: str, values: dict[str, Value]) -> dict[str, Value]:
        """``values`` with their connection variables' Jinja templates rendered where they
        are variables alone (``ansible_host: "{{ inventory_hostname }}.ib"``, common in
        group_vars/; see :mod:`.templates`), and left out where they are more, each of those
        said once: their text would be a host name or user that exists nowhere. Left
        unset, ~/.ssh/config or the default decides (not a lower-precedence value of the
        same variable, which the template overrode). A password's template (``{{ sudo_pw
        }}``) makes every variable it reads a secret: each is dropped from the playbook's
        variables (never printed, never in a script), its file checked as the password's
        own, and a template that does not render is said without its text."""
        kept = dict(values)
        plain: dict[str, object] | None = None
        for key, given in values.items():
            text = given.value
            if key not in CONNECTION_VARS or not isinstance(text, str) or not is_template(text):
                continue
            if plain is None:
                plain = {k: v.value for k, v in values.items()}
            secret = key == "ansible_become_password"
            used: set[str] = set()
            try:
                rendered = render(text, name, plain, used=used)
                kept[key] = dataclasses.replace(given, value=rendered)
                if rendered == "":
                    # An unset environment variable reads empty, as in Ansible. Its ssh
                    # plugin then passes no user, key or argument (ssh's own default
                    # decides: left unset here too, said), and fails the host for an empty
                    # address or port: refused here, with the template.
                    what = "its template" if secret else f"its template {text!r}"
                    if key in ("ansible_host", "ansible_port", "ansible_connection"):
                        raise self.error(key, values,
                                         f"{key}: {what} renders empty for {name}",
                                         "set what it reads (an environment variable, a "
                                         "variable) or write the value itself")
                    del kept[key]
                    self.warnings[f"{given.path or self.path}:{key}:empty"] = (
                        f"{given.path or self.path}: {key}: {what} renders empty (for "
                        f"{name}): left unset, as Ansible leaves it")
            except Unrendered as err:
                del kept[key]
                where = f"{given.path or self.path}" + (f":{given.line}" if given.line else "")
                # The reason names the part it stops at: the template is said once.
                what = "" if secret or repr(text) in str(err) else f" ({text!r})"
                why = "" if secret else f" ({err})"
                if key in _NEVER_GUESSED:
                    # Left unset, the host's inventory name (port 22, no become, root)
                    # would stand for it: another machine, or more rights, than Ansible's.
                    raise self.error(key, values,
                                     f"{key} is a Jinja template{what} that fleetclean does "
                                     f"not render{why}",
                                     f"write {key}'s value itself for {name}") from None
                self.warnings[f"{where}:{key}"] = (
                    f"{where}: {key} is a Jinja template{what} that fleetclean does "
                    f"not render{why}: left unset (write the value itself to use it)")
            if secret:
                for source in used & values.keys():
                    self.check_private(values[source].path or self.path)
                    if not source.startswith("ansible_"):
                        kept[source] = dataclasses.replace(values[source], value=_SECRET)
        return kept

    def make(self, name: str, values: dict[str, Value], groups: set[str]) -> Host:
        values = self.untemplated(name, values)
        connection = self.connection(values)
        args = self.ssh_args(values)
        key = self.text("ansible_ssh_private_key_file", values)
        config, config_path, system_after = (
            (None, None, False) if connection == "local" else self.config(values, args))
        self.become_method(values)
        settings = ssh_settings.merge(
            name,
            host=self.text("ansible_host", values),
            # ansible_port/ansible_user become Ansible's own -o Port=/-o User=, written
            # before the ssh arguments' -p/-l: ssh keeps the first.
            port=self.port(values) or args.port,
            user=self.text("ansible_user", values) or args.user,
            key=os.path.expanduser(key) if key else None,
            proxy_jump=args.proxy_jump,
            options=args.options,
            config=config,
            config_path=config_path,
            hostname=args.hostname,
            identities=args.identities,
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
            become_password=self.become_password(values),
            groups=tuple(sorted(groups - {"all"})),
            vars={
                # Every ansible_* name is Ansible's (passwords among them): never a
                # playbook variable, never printed by `inventory --json` or in a script;
                # nor what a password's template read (untemplated).
                k: v.value for k, v in values.items()
                if not k.startswith("ansible_") and v.value is not _SECRET
            },
            proxy_jump=settings.proxy_jump,
            ssh_options=settings.options,
            ssh_config=config_path,
            ssh_config_system=system_after,
            identities=settings.identities,
        )


@dataclass(frozen=True)
class Inventory:
    """Every host of one inventory file, in file order, and every group's hosts."""

    path: str
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]]
    warnings: tuple[str, ...] = ()

    def select(self, limit: str | None) -> list[Host]:
        """Hosts a ``--limit`` pattern selects (see :mod:`.limit`), file order.

        Raises ``InventoryError`` naming the pattern when it selects nothing.
        """
        names = select_names(limit, list(self.hosts), self.groups, source=self.path)
        return [self.hosts[name] for name in names]

    def with_connection(self, connection: Connection) -> Inventory:
        """Every host reached through ``connection`` (``-c``), whatever its inventory says."""
        hosts = {n: dataclasses.replace(h, connection=connection) for n, h in self.hosts.items()}
        return dataclasses.replace(self, hosts=hosts)


def resolve(
    builder: Builder,
    ssh_config: str | None,
    defaults: Mapping[str, Any] | None = None,
    dirs: VarsDirs | None = None,
    *,
    system_after: bool = False,
) -> Inventory:
    """Every host of ``builder`` with its effective variables; ``ssh_config`` a path or None;
    ``defaults``: connection variables from the command line, below every group's; ``dirs``:
    what the group_vars/ and host_vars/ beside the inventory files give."""
    depths = _depths(builder)
    memberships = _memberships(builder)
    maker = _HostMaker(builder.path, ssh_config, system_after)
    low = {k: Value(v, path="the command line") for k, v in (defaults or {}).items()}
    sources = dirs.sources if dirs is not None else []
    hosts = {
        name: maker.make(
            name, _effective(builder, name, groups, depths, low, dirs=sources), groups
        )
        for name, groups in memberships.items()
    }
    names = ["all", *(g for g in builder.groups if g not in ("all", "ungrouped")), "ungrouped"]
    groups = {group: tuple(h for h in hosts if group in memberships[h]) for group in names}
    said = dirs.warnings if dirs is not None else []
    return Inventory(path=builder.path, hosts=hosts, groups=groups,
                     warnings=(*said, *maker.warnings.values()))

