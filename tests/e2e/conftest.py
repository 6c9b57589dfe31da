"""The e2e tests' default fleet: one simulated node a module, idle again after each test.

A module that needs more (several nodes, containers, Slurm) defines its own ``shared`` and
``fleet`` fixtures, which take the place of these for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from simhelp import reset_node

from fleetclean.sim import SimFleet


@pytest.fixture(scope="module")
def shared(module_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    return module_fleet_factory(1)


@pytest.fixture
def fleet(shared: SimFleet) -> Iterator[SimFleet]:
    yield shared
    reset_node(shared)  # the next test finds the node idle, whatever this one left
