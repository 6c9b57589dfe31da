"""``slurm://[USER@]LOGINHOST[:PORT]``: Slurm's commands over SSH on a login node.

Where fleetclean runs on a laptop, Slurm's client (and its ``slurm.conf`` and munge key)
lives on the cluster's login node. ``-i slurm://login01`` reads the nodes with ``sinfo``
there, and ``--drain-dirty``/``--resume-clean`` then run ``scontrol`` there too. The login
node is reached like any host: through the transport (host keys checked against
known_hosts, ``--accept-new-host-keys``, ``--connect-timeout``), with its address, user,
port and key from ssh_config (``-F``) unless the source names user or port itself.

>>> parse_source("slurm://ops@login01.lab:2222")
LoginSpec(host='login01.lab', user='ops', port=2222)
>>> parse_source("slurm://login01")
LoginSpec(host='login01', user=None, port=None)
>>> parse_source("slurm://ops@")
Traceback (most recent call last):
...
fleetclean.errors.InventoryError: -i 'slurm://ops@': no login host after slurm:// (e.g. -i slurm://login01)
>>> remote_command(["scontrol", "update", "NodeName=node02", "Reason=fleetclean R1: dirty: x"])
"exec scontrol update NodeName=node02 'Reason=fleetclean R1: dirty: x'"
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetclean.errors import InventoryError
from fleetclean.inventory import ssh_settings
from fleetclean.inventory.build import resolve
from fleetclean.inventory.builder import Builder, Value
from fleetclean.models import Host
from fleetclean.slurm.nodes import Runner, SlurmUnavailable, failed

if TYPE_CHECKING:
    from fleetclean.transport import Options

SCHEME = "slurm://"


@dataclass(frozen=True)
class LoginSpec:
    host: str
    user: str | None
    port: int | None


def parse_source(source: str) -> LoginSpec:
    """``slurm://[USER@]HOST[:PORT]`` -> its parts; InventoryError when it is not that."""
    where = f"-i '{source}'"
    rest = source.removeprefix(SCHEME).rstrip("/")
    user, _, hostport = rest.rpartition("@")
    host, colon, port_text = hostport.partition(":")
    if not host or any(c.isspace() or c in "/,@" for c in host):
        raise InventoryError(f"{where}: no login host after {SCHEME}",
                             hint="e.g. -i slurm://login01")
    port = None
    if colon:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise InventoryError(f"{where}: port '{port_text}' is not a number from 1 to 65535",
                                 hint="e.g. -i slurm://login01:2222")
        port = int(port_text)
    return LoginSpec(host, user or None, port)


def login_host(spec: LoginSpec, ssh_config: str | None) -> Host:
    """The login node as a host, its settings filled from ssh_config as for ``ssh HOST``
    (``ssh_config`` None: ``~/.ssh/config``; empty: none), as the nodes' are."""
    system_after = ssh_config is None  # as ssh: its system-wide config unless given one
    if ssh_config is None:
        ssh_config = ssh_settings.default_config_path()
    builder = Builder(f"{SCHEME}{spec.host}")
    values: dict[str, Value] = {}
    if spec.user:
        values["ansible_user"] = Value(spec.user)
    if spec.port:
        values["ansible_port"] = Value(spec.port)
    builder.add_hosts("ungrouped", spec.host, values, None, None)
    return resolve(builder, ssh_config or None, system_after=system_after).hosts[spec.host]


def remote_command(argv: Sequence[str]) -> str:
    """The line the login node's bash runs (``transport.boot``'s command): every word
    quoted, nothing expanded."""
    return "exec " + shlex.join(argv)


def runner(source: str, ssh_config: str | None, opts: Options) -> Runner:
    """A :data:`~fleetclean.slurm.nodes.Runner` on the login node ``source`` names."""
    host = login_host(parse_source(source), ssh_config)

    def run(argv: Sequence[str]) -> str:
        from fleetclean.transport.session import Session

        with Session(opts) as session:
            out = session.run(host, remote_command(argv) + "\n")
        where = f"on {host.name}"
        if out.failure is not None:
            raise SlurmUnavailable(f"{argv[0]} {where}: {out.failure.message}")
        if out.exit_code != 0:
            if out.exit_code == 127:
                raise SlurmUnavailable(f"{argv[0]} not found {where}")
            raise SlurmUnavailable(f"{failed(argv[0], out.stderr, out.exit_code)} ({where})")
        return out.stdout

    return run
