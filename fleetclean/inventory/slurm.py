"""Hosts from Slurm: ``-i slurm:`` reads the nodes ``sinfo`` lists on this machine,
``-i slurm://LOGINHOST`` those it lists on a login node (over SSH, see
:mod:`fleetclean.slurm.login`).

Each node becomes a host in group ``slurm``, in ``partition_NAME`` for each of its
partitions (the default partition's ``*`` dropped) and in ``state_STATE`` for its state, so
``-l 'partition_gpu:&state_idle'`` picks the idle nodes of partition gpu. States are
folded into the five a cleanup cares about (``state_idle``, ``state_mixed``,
``state_alloc``, ``state_drain``, ``state_down``); any other state keeps its own name
(``state_completing``, ``state_maint``...). sinfo's flags after a state (``*`` not
responding, ``~`` powered off, ``-`` planned, ``#``, ``!``, ``%``, ``$``, ``@``, ``^``)
are dropped. Where to connect (address, user, port, key) comes, as for a host list, from
ssh_config or from a YAML/INI inventory given with another ``-i``.

>>> rows = parse_sinfo("node01|gpu*|idle\\nnode01|debug|idle\\nnode02|gpu*|drained*\\n")
>>> [(r.name, r.partition, r.state) for r in rows]
[('node01', 'gpu', 'idle'), ('node01', 'debug', 'idle'), ('node02', 'gpu', 'drained')]
>>> state_groups("mixed-"), state_groups("idle+drain"), state_groups("completing")
(['state_mixed'], ['state_idle', 'state_drain'], ['state_completing'])
>>> parse_sinfo("node01 gpu idle\\n")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: line 1: expected NODE|PARTITION|STATE, got 'node01 gpu idle'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from fleetclean.inventory.builder import Builder
from fleetclean.slurm.nodes import Runner, SlurmUnavailable, run_here

__all__ = ["SINFO_ARGV", "LoginRunners", "is_slurm", "label", "parse_sinfo", "read_slurm",
           "state_groups"]

SINFO_ARGV = ("sinfo", "--noheader", "--Node", "--format=%N|%P|%T")
LoginRunners = Callable[[str], Runner]
"""``login(source) -> Runner`` for a ``slurm://LOGINHOST`` source (the command layer makes
it, with the transport: this package opens no connection itself)."""
_FLAGS = "*~#!%$@^-"
# sinfo's long state names -> the group a cleanup selects on.
_FOLD = {
    "idle": "idle",
    "mixed": "mixed",
    "allocated": "alloc",
    "alloc": "alloc",
    "drained": "drain",
    "draining": "drain",
    "drain": "drain",
    "down": "down",
    "fail": "down",
    "failing": "down",
    "not_responding": "down",
}


@dataclass(frozen=True)
class SinfoRow:
    """One ``sinfo -N`` line: a node in one partition, its state without flags."""

    name: str
    partition: str
    state: str
    default_partition: bool


def is_slurm(source: str) -> bool:
    """``slurm:`` (this machine) or ``slurm://LOGINHOST``.

    >>> is_slurm("slurm:"), is_slurm("slurm://login01"), is_slurm("lab.yml")
    (True, True, False)
    """
    return source == "slurm:" or source.startswith("slurm://")


def label(source: str) -> str:
    return f"-i '{source}'"


def parse_sinfo(text: str) -> list[SinfoRow]:
    """Rows of ``sinfo --noheader --Node --format=%N|%P|%T``; ValueError on a line that
    is not that."""
    rows: list[SinfoRow] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"line {number}: expected NODE|PARTITION|STATE, got {line!r}")
        name, partition, state = parts
        default = partition.endswith("*")
        rows.append(SinfoRow(name, partition.rstrip("*"), state.rstrip(_FLAGS).lower(), default))
    return rows


def state_groups(state: str) -> list[str]:
    """Group names for one sinfo state (compound states such as ``idle+drain`` give one
    group per part)."""
    groups: list[str] = []
    for part in state.rstrip(_FLAGS).lower().split("+"):
        folded = _FOLD.get(part, re.sub(r"\W", "_", part))
        if folded and f"state_{folded}" not in groups:
            groups.append(f"state_{folded}")
    return groups


def read_slurm(source: str, builder: Builder, login: LoginRunners | None = None) -> None:
    """Add every node ``sinfo`` lists to ``builder``: this machine's sinfo for ``slurm:``,
    the login node's (through ``login``) for ``slurm://LOGINHOST``. InventoryError when
    sinfo cannot run."""
    run: Runner = run_here
    if source != "slurm:":
        if login is None:
            raise builder.error("slurm://LOGINHOST is not readable here", None, None,
                                hint="give the nodes with -i slurm: on the login node")
        run = login(source)
    try:
        text = run(SINFO_ARGV)
    except SlurmUnavailable as err:
        hint = "check SLURM_CONF" if source == "slurm:" else "check the login node"
        if "not found" in str(err):
            hint = ("install Slurm's client (slurm-client) or give the nodes in an inventory "
                    "file")
        raise builder.error(str(err), None, None, hint=hint) from None
    try:
        rows = parse_sinfo(text)
    except ValueError as err:
        raise builder.error(f"cannot read sinfo's output: {err}", None, None) from None
    if not rows:
        raise builder.error("sinfo lists no nodes", None, None, hint="check SLURM_CONF")
    for row in rows:
        groups = ["slurm", _group_name("partition", row.partition), *state_groups(row.state)]
        for group in groups:
            builder.add_child("all", group, None, None)
            builder.add_hosts(group, row.name, {}, None, None)


def _group_name(prefix: str, name: str) -> str:
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"
