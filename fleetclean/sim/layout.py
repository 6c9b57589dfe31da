"""Where everything of a simulated fleet lives: names, addresses, state-dir paths. Pure.

Node N (1-based) is ``nodeNN`` at ``127.S.(1 + (N-1)//250).((N-1)%250 + 1)``, S being the
fleet's subnet octet (0 unless two fleets must coexist): node01 -> 127.0.1.1, node251 ->
127.0.2.1. Every address of 127/8 reaches ``lo``, so nothing has to be configured.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path("/tmp/fleetclean-sim")
STATE_DIR_ENV = "FLEETCLEAN_SIM_DIR"
NODES_PER_OCTET = 250
PACKAGE_DIR = Path(__file__).resolve().parent
# Inside a node, the node's own state dir is bind-mounted here (see node_init.py).
IN_NODE_DIR = "/run/fleetclean"
# ... and this package's directory here, readable by every account of the node.
IN_NODE_CODE = "/run/fleetclean-code"


def default_state_dir() -> Path:
    """``$FLEETCLEAN_SIM_DIR`` or ``/tmp/fleetclean-sim``."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def node_name(number: int) -> str:
    """``node_name(1) == "node01"``; ``node_name(120) == "node120"``."""
    return f"node{number:02d}"


def node_address(number: int, subnet: int = 0) -> str:
    """``node_address(1) == "127.0.1.1"``, ``node_address(251, 7) == "127.7.2.1"``."""
    if number < 1 or not 0 <= subnet <= 255:
        raise ValueError(f"bad node number {number} or subnet {subnet}")
    third, fourth = divmod(number - 1, NODES_PER_OCTET)
    if third + 1 > 255:
        raise ValueError(f"node {number} does not fit in 127.{subnet}.0.0/16")
    return f"127.{subnet}.{third + 1}.{fourth + 1}"


def node_python() -> str:
    """The interpreter for processes inside nodes: the system ``python3`` (so that their
    /proc/PID/comm reads ``python3``), else the one running us."""
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    return os.path.realpath(sys.executable)


@dataclass(frozen=True)
class StateLayout:
    """Paths below one fleet's state dir."""

    root: Path

    @property
    def fleet_file(self) -> Path:
        return self.root / "fleet.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "pids"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def host_ca(self) -> Path:
        """The CA key that signs the nodes' host keys (a fleet made with ``host_ca``)."""
        return self.root / "host_ca"

    @property
    def sudo_password(self) -> Path:
        return self.root / "sudo_password"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yaml"

    def node_dir(self, name: str) -> Path:
        return self.root / "nodes" / name
