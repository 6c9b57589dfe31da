"""Slurm nodes as this machine's ``sinfo`` sees them, and ``scontrol update`` on them.

Every command runs here, with this process's environment (``SLURM_CONF``); a Slurm that
cannot be reached is a :class:`SlurmUnavailable` carrying the command's own words.

>>> nodes = parse_nodes("node01|idle|none\\nnode01|idle|none\\n"
...                     "node02|drained|fleetclean 20261201T1: dirty: GPU2 4096 MiB\\n")
>>> sorted(nodes), nodes["node02"].state, nodes["node02"].reason
(['node01', 'node02'], 'drained', 'fleetclean 20261201T1: dirty: GPU2 4096 MiB')
>>> nodes["node01"].reason
''
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

SINFO_ARGV = ("sinfo", "--noheader", "--Node", "--format=%N|%T|%E")
TIMEOUT_S = 30.0


class SlurmUnavailable(Exception):
    """sinfo or scontrol is missing, failed or did not answer."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # sinfo's long form with its flags, e.g. ``idle``, ``drained*``, ``mixed-``
    reason: str  # '' when none


def parse_nodes(text: str) -> dict[str, NodeState]:
    """``sinfo --Node --format=%N|%T|%E`` -> node -> state (a node listed once per
    partition is one node)."""
    nodes: dict[str, NodeState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not parts[0]:
            continue
        name, state, reason = parts
        nodes[name] = NodeState(name, state, "" if reason == "none" else reason)
    return nodes


def query() -> dict[str, NodeState]:
    """Every node's state and reason now."""
    return parse_nodes(_run(list(SINFO_ARGV)))


def update(node: str, *settings: str) -> None:
    """``scontrol update NodeName=NODE SETTING...``, e.g. ``State=DRAIN``, ``Reason=...``
    (argv, no shell: a reason needs no quoting)."""
    _run(["scontrol", "update", f"NodeName={node}", *settings])


def _run(argv: list[str]) -> str:
    path = shutil.which(argv[0])
    if path is None:
        raise SlurmUnavailable(f"{argv[0]} not found on this machine")
    try:
        done = subprocess.run([path, *argv[1:]], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer in {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise SlurmUnavailable(
            f"{argv[0]} failed: {lines[-1] if lines else f'exit status {done.returncode}'}"
        )
    return done.stdout
