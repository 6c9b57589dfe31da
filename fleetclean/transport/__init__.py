"""Run one script on one host: bash reading it on stdin over SSH (fabric/paramiko), or local bash.

The only package that imports fabric and paramiko. It knows nothing of stages. One module
per job:

- ``base``: ``Options``, ``ScriptOutput``, ``TransportFailure`` (no SSH import: the CLI's
  ``--help`` and a local-only run never load paramiko);
- ``sshlib``: the one import of fabric and paramiko (without what invoke loads for its test
  double);
- ``hostkeys``: the known_hosts policy on every connection and hop (``hostcerts``: host
  certificates, for its ``@cert-authority`` lines);
- ``hops``: jump hosts and ProxyCommand resolved through ssh_config (``includes``: its
  Include; ``system``: ssh's system-wide ssh_config and known_hosts, after the user's);
- ``pool``: one connection per hop chain, and fabric's gateway weak spots worked around;
- ``connect``: one ``fabric.Connection``, phase by phase; ``classify``: its failures;
- ``boot``: the command that starts the script over SSH, safe from a login shell's
  startup files;
- ``become``: sudo's dialogue before the script starts (its prompt, the password, its
  refusals);
- ``stream``: the select() loop that streams a script's output; ``local``: the local runner;
- ``session``: ``Session``, which ties them together for one fleet run.

>>> Options().connect_timeout
10.0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleetclean.transport.base import LineCallback, Options, ScriptOutput, TransportFailure

if TYPE_CHECKING:
    from fleetclean.transport.session import Session

__all__ = ["LineCallback", "Options", "ScriptOutput", "Session", "TransportFailure"]


def __getattr__(name: str) -> Any:
    # Session pulls in fabric, paramiko and invoke (~100 ms): loaded when first asked for.
    if name == "Session":
        return importlib.import_module("fleetclean.transport.session").Session
    raise AttributeError(f"module 'fleetclean.transport' has no attribute {name!r}")
