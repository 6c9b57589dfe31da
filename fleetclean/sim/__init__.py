"""The simulated fleet: 8-GPU nodes as PID+mount namespaces with a real sshd each.

``from fleetclean.sim import SimFleet`` -- see ``fleet`` for the API, ``node_init`` for a
node's PID 1, ``nvidia_smi`` for the fake nvidia-smi, ``launcher``/``programs`` for the
workloads. Linux and root only; the rest of fleetclean never imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetclean.sim.fleet import SimFleet
    from fleetclean.sim.node import SimNode, SimProcess

__all__ = ["SimFleet", "SimNode", "SimProcess"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `fleetclean --help` and every run build the `sim` subcommand's
    # parser, which must not pay for the simulator itself.
    if name == "SimFleet":
        from fleetclean.sim.fleet import SimFleet

        return SimFleet
    if name in ("SimNode", "SimProcess"):
        from fleetclean.sim import node

        return getattr(node, name)
    raise AttributeError(f"module 'fleetclean.sim' has no attribute {name!r}")
