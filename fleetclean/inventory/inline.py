"""Hosts written on the command line, as Ansible's host lists: ``-i 'gpu01,gpu02,'``.

A source is a host list when it holds a comma and names no file (Ansible's own rule): so a
single host is ``-i 'gpu01,'``. Entries may be ranges (``gpu[01:16].lab``, Ansible's
advanced host list) and may carry a port (``gpu01:2222``). The hosts land in ``ungrouped``
and take their address, user, port and key from ssh_config, as bare names in a file do.

>>> from fleetclean.inventory.builder import Builder
>>> is_inline("gpu01,"), is_inline("lab.yml")
(True, False)
>>> b = Builder(label("gpu[01:02].lab, login:2222,"))
>>> read_inline("gpu[01:02].lab, login:2222,", b)
>>> list(b.hosts), b.hosts["login"]["ansible_port"].value, b.groups["ungrouped"].hosts[0]
(['gpu01.lab', 'gpu02.lab', 'login'], 2222, 'gpu01.lab')
>>> read_inline("gpu[09:01],", Builder(label("gpu[09:01],")))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: -i 'gpu[09:01],': host range 'gpu[09:01]' runs backwards ...
"""

from __future__ import annotations

import os

from fleetclean.inventory.builder import Builder

__all__ = ["is_inline", "label", "read_inline"]


def is_inline(source: str) -> bool:
    """True when ``-i source`` is a host list rather than a file."""
    return "," in source and not os.path.exists(source)


def label(source: str) -> str:
    """How errors name a host list: as it was given."""
    return f"-i '{source}'"


def read_inline(source: str, builder: Builder) -> None:
    """Add every host of ``source`` to ``builder``'s ``ungrouped`` group."""
    column = 1
    for entry in source.split(","):
        name = entry.strip()
        at = column + len(entry) - len(entry.lstrip())
        column += len(entry) + 1
        if not name:
            continue
        if any(c.isspace() for c in name):
            raise builder.error(
                f"host '{name}' has a space in its name",
                None,
                at,
                hint="separate hosts with commas: -i 'gpu01,gpu02,'",
            )
        builder.add_hosts("ungrouped", name, {}, None, at)
