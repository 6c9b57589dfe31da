"""The simulated fleet: 8-GPU nodes as PID+mount namespaces with a real sshd each.

``from fleetclean.sim import SimFleet`` -- see ``fleet`` for the API, ``node_init`` for a
node's PID 1, ``nvidia_smi`` for the fake nvidia-smi, ``launcher``/``programs`` for the
workloads. Linux and root only; the rest of fleetclean never imports this package.
"""

from __future__ import annotations

from fleetclean.sim.fleet import SimFleet
from fleetclean.sim.node import SimNode, SimProcess

__all__ = ["SimFleet", "SimNode", "SimProcess"]
