"""Slurm's client commands, run here or on a login node, and what they say about nodes.

A :data:`Runner` runs one Slurm client command (``sinfo``, ``scontrol``) and returns its
stdout: :func:`run_here` on this machine, with this process's environment (``SLURM_CONF``),
or one from :mod:`fleetclean.slurm.login` over SSH on a login node (``slurm://LOGINHOST``).
A Slurm that cannot be reached is a :class:`SlurmUnavailable` carrying the command's own
words.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SINFO_ARGV = ("sinfo", "--noheader", "--Node", "--format=%N|%T|%E")
TIMEOUT_S = 30.0

Runner = Callable[[Sequence[str]], str]
"""``runner(argv) -> stdout`` of one Slurm client command; SlurmUnavailable when it cannot
run or fails."""


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


def query(runner: Runner | None = None) -> dict[str, NodeState]:
    """Every node's state and reason now."""
    return parse_nodes((runner or run_here)(SINFO_ARGV))


def update(node: str, *settings: str, runner: Runner | None = None) -> None:
    """``scontrol update NodeName=NODE SETTING...``, e.g. ``State=DRAIN``, ``Reason=...``
    (argv, never a shell line of ours: a reason needs no quoting here)."""
    (runner or run_here)(["scontrol", "update", f"NodeName={node}", *settings])


def run_here(argv: Sequence[str]) -> str:
    """Run one Slurm client command on this machine."""
    path = shutil.which(argv[0])
    if path is None:
        raise SlurmUnavailable(f"{argv[0]} not found on this machine")
    try:
        done = subprocess.run([path, *argv[1:]], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} did not answer in {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise SlurmUnavailable(failed(argv[0], done.stderr, done.returncode))
    return done.stdout


def failed(tool: str, stderr: str, code: int | None) -> str:
    """The message for a Slurm command that failed: its last stderr line.

    >>> failed("sinfo", "sinfo: error: Unable to contact slurm controller\\n", 1)
    'sinfo failed: sinfo: error: Unable to contact slurm controller'
    """
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"{tool} failed: {lines[-1].strip() if lines else f'exit status {code}'}"
