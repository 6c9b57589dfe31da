"""Inventory sources -> one :class:`~fleetclean.inventory.build.Inventory`.

>>> import pathlib, tempfile
>>> tmp = pathlib.Path(tempfile.mkdtemp())
>>> _ = (tmp / "lab.yml").write_text(
...     "all:\\n  vars: {max_used_mib: 1024}\\n  children:\\n    training:\\n"
...     "      hosts:\\n        h200-[01:02]: {ansible_user: root}\\n")
>>> inv = load_inventory(tmp / "lab.yml", ssh_config="")
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

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from fleetclean.errors import InventoryError
from fleetclean.inventory import inline, slurm, ssh_settings, vars_dirs
from fleetclean.inventory.build import Inventory, resolve
from fleetclean.inventory.builder import Builder
from fleetclean.inventory.ini_file import looks_like_ini, read_ini
from fleetclean.inventory.yaml_file import read_yaml
from fleetclean.models import Host

__all__ = ["load_inventory", "local_inventory"]


def load_inventory(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    ssh_config: str | os.PathLike[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    login: slurm.LoginRunners | None = None,
) -> Inventory:
    """Read inventory sources into one inventory; ``ssh_config`` None means ``~/.ssh/config``
    if present.

    A source is a YAML or INI file, a host list (``'gpu01,gpu02,'``, see :mod:`.inline`),
    or ``slurm:``, the nodes ``sinfo`` lists (see :mod:`.slurm`), or ``slurm://LOGINHOST``,
    the nodes sinfo lists on a login node, which ``login(source)`` runs it on.
    Several sources merge as in Ansible: groups are united, and where two sources set one
    variable of a group or host, the later source wins.
    ``$FLEETCLEAN_SSH_CONFIG`` replaces the ssh config default; an empty value (env or
    argument) reads no ssh config at all. A given config file that is missing is an error.
    ``.yml``/``.yaml``/``.json`` files are YAML, ``.ini`` files INI, others are told apart
    by their first line. Every problem is one ``InventoryError``: file, line, column, fix.
    ``defaults`` are connection variables given on the command line (``ansible_become``
    for ``-b``...): every inventory's own value wins over them, as in Ansible.
    ``group_vars/`` and ``host_vars/`` beside an inventory file are read as Ansible reads
    them (see :mod:`.vars_dirs`); a host list or Slurm source has none.
    """
    names = [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [
        os.fspath(s) for s in sources
    ]
    if not names:
        raise InventoryError("no inventory given", hint="give -i FILE or -i 'host1,host2,'")
    builder = Builder(names[0])
    labels = []
    files = []  # the sources Ansible reads group_vars/ and host_vars/ beside
    for source in names:
        if slurm.is_slurm(source):
            builder.path = slurm.label(source)
            slurm.read_slurm(source, builder, login)
        elif inline.is_inline(source):
            builder.path = inline.label(source)
            inline.read_inline(source, builder)
        else:
            builder.path = source
            _read_file(source, builder)
            files.append(source)
        labels.append(builder.path)
    builder.path = " + ".join(labels)
    if not builder.hosts:
        raise builder.error(
            "inventory defines no hosts",
            None,
            None,
            hint="list hosts under a group's 'hosts:' in YAML or in a [group] section in INI",
        )
    # An empty string (e.g. FLEETCLEAN_SSH_CONFIG= passed through) means: read no ssh config.
    config = os.fspath(ssh_config) if ssh_config is not None else ssh_settings.default_config_path()
    config = config or None
    if config is not None and not os.path.isfile(config):
        ssh_settings.load_config(config)  # raises the missing-file error with its path
    dirs = vars_dirs.read_vars_dirs(files, builder.groups, builder.hosts)
    # ssh reads its system-wide config after the user's unless it is given one (-F).
    return resolve(builder, config, defaults, dirs, system_after=ssh_config is None)


def local_inventory(defaults: Mapping[str, Any] | None = None) -> Inventory:
    """``--local``: this machine alone, named after its hostname, reached without SSH;
    ``defaults`` as for :func:`load_inventory` (become from the command line).

    >>> inv = local_inventory({"ansible_become": True})
    >>> [(h.address, h.connection, h.groups, h.become) for h in inv.select(None)]
    [('localhost', 'local', ('ungrouped',), True)]
    """
    name = socket.gethostname() or "localhost"
    given = defaults or {}
    host = Host(name=name, address="localhost", connection="local", groups=("ungrouped",),
                become=bool(given.get("ansible_become")),
                become_user=given.get("ansible_become_user"))
    return Inventory(
        path="--local", hosts={name: host}, groups={"all": (name,), "ungrouped": (name,)}
    )


def _read_file(source: str, builder: Builder) -> None:
    text = _read_text(source)
    if not text.strip():
        raise builder.error("inventory file is empty", None, None, hint="add 'all:' with 'hosts:'")
    extension = os.path.splitext(source)[1].lower()
    if extension in (".yml", ".yaml", ".json"):
        read_yaml(text, builder)
    elif extension == ".ini" or looks_like_ini(text):
        read_ini(text, builder)
    else:
        read_yaml(text, builder)


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
            "inventory file does not exist", path=path, hint=_missing_hint(path)
        ) from None
    except OSError as err:
        raise InventoryError(
            f"cannot read inventory file: {err.strerror}",
            path=path,
            hint="check that it is a readable file",
        ) from None
    return vars_dirs.decoded(data, path)


def _missing_hint(path: str) -> str:
    """A bare word given to -i is most likely one host meant as a host list."""
    extension = os.path.splitext(path)[1]
    if os.sep in path or extension.lower() in (".yml", ".yaml", ".ini", ".json"):
        return "check the path given to -i"
    return f"check the path given to -i; for the host itself, end it with a comma: -i '{path},'"
