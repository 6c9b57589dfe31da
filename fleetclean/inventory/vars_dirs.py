"""``group_vars/`` and ``host_vars/`` beside an inventory file, read as Ansible reads them.

For a group or host NAME, the first of these in ``group_vars/`` (``host_vars/``) is read:
``NAME`` (a file with no extension), ``NAME.yml``, ``NAME.yaml``, ``NAME.json``; one that
is a directory gives every file under it, sorted by name level by level, whose name has no
extension or one of those three, hidden (``.x``) and backup (``x~``) names left out; a later
file wins a name an earlier one set. Files for names the inventory does not have are not
read. Where the variables stand among the inventory's own: see :mod:`.build`.

An Ansible Vault file is left out with a warning, and so is a ``!vault``-encrypted value
(the name stays unset): fleetclean cannot decrypt them, and they mostly hold secrets for
other plays. Anything else wrong is one ``InventoryError`` naming the file.

>>> import pathlib, tempfile
>>> here = pathlib.Path(tempfile.mkdtemp())
>>> (here / "group_vars" / "all").mkdir(parents=True)
>>> _ = (here / "group_vars" / "all" / "10-ssh.yml").write_text("ansible_user: root\\n")
>>> _ = (here / "group_vars" / "all" / "20-site.yml").write_text("ansible_user: ops\\n")
>>> _ = (here / "group_vars" / "training.json").write_text('{"grace": 5}')
>>> got = read_vars_dirs([str(here / "hosts.ini")], ["all", "training"], ["gpu01"])
>>> [(g, k, v.value) for g, vs in got.sources[0].groups.items() for k, v in vs.items()]
[('all', 'ansible_user', 'ops'), ('training', 'grace', 5)]
>>> _ = (here / "host_vars").write_text("")
>>> read_vars_dirs([str(here / "hosts.ini")], ["all"], ["gpu01"]).warnings
... # doctest: +ELLIPSIS
['.../host_vars is not a directory: not read (Ansible skips it too)']
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fleetclean import yamltext
from fleetclean.engine.checks import boolean
from fleetclean.errors import InventoryError, VariableError
from fleetclean.inventory.builder import Builder, Value
from fleetclean.inventory.yaml_file import read_vars

__all__ = ["DirVars", "VarsDirs", "read_vars_dirs"]

# Ansible's host_group_vars: these, or no extension at all ('' first, so that NAME/ and
# NAME win over NAME.yml).
EXTENSIONS = ("", ".yml", ".yaml", ".json")
VAULT_HEADER = "$ANSIBLE_VAULT;"


@dataclass
class DirVars:
    """What one inventory file's group_vars/ and host_vars/ give: name -> variables."""

    groups: dict[str, dict[str, Value]] = field(default_factory=dict)
    hosts: dict[str, dict[str, Value]] = field(default_factory=dict)


@dataclass
class VarsDirs:
    """One :class:`DirVars` per inventory file, in ``-i`` order (a later one wins), and what
    reading them left to say."""

    sources: list[DirVars] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_vars_dirs(
    files: Sequence[str], groups: Iterable[str], hosts: Iterable[str]
) -> VarsDirs:
    """The variables of ``groups`` and ``hosts`` in the directories beside each inventory
    file of ``files``; a directory beside two of them is read once."""
    groups, hosts = list(groups), list(hosts)
    out = VarsDirs()
    said: dict[str, None] = {}  # warnings once each, in order
    read: dict[str, DirVars] = {}
    for inventory in files:
        base = os.path.dirname(os.path.abspath(inventory))
        if base not in read:
            reader = _Reader(base, said)
            read[base] = DirVars(
                groups=reader.kind("group_vars", groups), hosts=reader.kind("host_vars", hosts)
            )
        out.sources.append(read[base])
    out.warnings = list(said)
    return out


class _Reader:
    """Reads the vars directories of one inventory directory ``base``."""

    def __init__(self, base: str, warnings: dict[str, None]) -> None:
        self.base = base
        self.warnings = warnings

    def kind(self, subdir: str, names: list[str]) -> dict[str, dict[str, Value]]:
        """``subdir`` (group_vars or host_vars): each of ``names`` with a file there ->
        its variables."""
        top = os.path.join(self.base, subdir)
        if not os.path.exists(top):
            return {}
        if not os.path.isdir(top):
            self.warnings[f"{top} is not a directory: not read (Ansible skips it too)"] = None
            return {}
        # One listing, not a stat per candidate: 20,000 hosts would be 80,000 stats.
        entries = set(_list(top))
        out: dict[str, dict[str, Value]] = {}
        for name in names:
            files = self.files_for(top, name, entries)
            if files:
                merged: dict[str, Value] = {}
                for path in files:
                    merged.update(self.read(path))
                out[name] = merged
        return out

    def files_for(self, top: str, name: str, entries: set[str]) -> list[str]:
        for candidate in (name + ext for ext in EXTENSIONS):
            path = os.path.join(top, candidate)
            if candidate not in entries or not os.path.exists(path):
                continue  # a dangling symlink is no candidate, as for Ansible
            return _dir_files(path) if os.path.isdir(path) else [path]
        return []

    def read(self, path: str) -> dict[str, Value]:
        text = _read_text(path)
        if text.lstrip().startswith(VAULT_HEADER):
            self.warnings[
                f"{path} is encrypted with Ansible Vault, which fleetclean cannot decrypt: "
                "not read (set what fleetclean needs from it in a file that is not encrypted)"
            ] = None
            return {}
        variables, sealed, odd = read_vars(text, Builder(path))
        for name in sealed:
            self.warnings[
                f"{path}:{name.line}: {name.value} is encrypted with '!vault', which "
                "fleetclean cannot decrypt: left unset"
            ] = None
        for name in odd:
            where = f"{path}:{name.line}" if name.line else path
            self.warnings[f"{where}: '{name.value}' is not a variable name fleetclean can "
                          "use: left out (letters, digits and underscores only)"] = None
        forced = variables.get("force")
        if forced is not None and _truthy(forced.value):
            # An Ansible repository's files were written for other tools: a `force` meant
            # for one of its roles would pass fleetclean's guard on every run of the hosts.
            where = f"{path}:{forced.line}" if forced.line else path
            self.warnings[f"{where}: force is set for every run of these hosts (fleetclean "
                          "then passes its guard stage by); give -e force=true to one run "
                          "instead"] = None
        for value in variables.values():
            # A relative path in it (ssh -F) is the inventory's, wherever the file sits.
            value.base = self.base
        return variables  # aliases resolved with the inventory's (build._effective)


def _truthy(value: object) -> bool:
    """Whether a run would take ``value`` for true, by the playbooks' own reading of it; one
    that is neither (refused at the run) counts as set."""
    try:
        return boolean(value, None, "force")
    except VariableError:
        return True


def _dir_files(path: str) -> list[str]:
    """The files a NAME/ directory gives, in the order they are merged."""
    out: list[str] = []
    for entry in sorted(_list(path)):
        if entry.startswith(".") or entry.endswith("~"):  # hidden files, editors' backups
            continue
        full = os.path.join(path, entry)
        extension = os.path.splitext(entry)[1]
        if os.path.isdir(full):
            # Only a directory without an extension is looked into, as Ansible does.
            if not extension:
                out.extend(_dir_files(full))
        elif os.path.isfile(full) and extension in EXTENSIONS:
            out.append(full)
    return out


def _list(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError as err:
        raise InventoryError(
            f"cannot read directory: {err.strerror}",
            path=path,
            hint="give yourself read and search permission on it (chmod u+rx), or remove it",
        ) from None


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise InventoryError(
            f"cannot read variables file: {err.strerror}",
            path=path,
            hint="give yourself read permission on it (chmod u+r), or remove it",
        ) from None
    return decoded(data, path)


def decoded(data: bytes, path: str) -> str:
    """An inventory or variables file's bytes as text (a BOM dropped); bytes that are not
    UTF-8 are an error naming where they are."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        said, line, column, hint = yamltext.undecodable(data, err)
        raise InventoryError(said, path=path, line=line, column=column, hint=hint) from None
