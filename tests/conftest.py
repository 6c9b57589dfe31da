"""Shared fixtures: the simulated fleet, and the real CLI run in-process against it.

Tests marked ``sim`` need Linux, root, unshare/nsenter and /usr/sbin/sshd; elsewhere they
are skipped with the reason. ``sim_fleet_factory`` gives each test its own fleets, each in
its own state dir and its own 127.S.0.0/16 subnet, and always takes them down, failed test
or not, then checks that no process the simulator started is left.
"""

from __future__ import annotations

import io
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from simhelp import (
    Cli,
    CliResult,
    claim_subnet,
    down_checked,
    fleet_subnet,
    module_subnet,
    release_subnet,
    up_claimed,
)

from fleetclean.cli import Env, main

# Ctrl-C reaches the CLI a test starts as it does from a terminal. A suite started as a
# background job of a non-interactive shell (`bash .ci/run &`) has SIGINT ignored, every
# child inherits an ignored signal through exec, and Python then installs no
# KeyboardInterrupt handler: the tests that press Ctrl-C would test the shell, not
# fleetclean. A handler (not SIG_IGN) is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No test reads this machine's /etc/ssh (a developer's or CI's site settings, host keys):
# the tests of ssh's system-wide files point fleetclean at a directory of their own. Set
# here, before any fixture, so that every CLI a test starts (a subprocess too) inherits it.
os.environ["FLEETCLEAN_SSH_SYSTEM_DIR"] = ""

SIM_SKIP_REASON: str | None = None
try:
    from fleetclean.errors import SimError
    from fleetclean.sim import SimFleet
    from fleetclean.sim.fleet import check_host

    check_host()
except (ImportError, SimError) as exc:  # pragma: no cover - depends on the machine
    SIM_SKIP_REASON = f"simulated fleet unavailable: {exc}"

_subnets = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SIM_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=SIM_SKIP_REASON)
    for item in items:
        if "sim" in item.keywords:
            item.add_marker(skip)


def free_subnet() -> int:
    """A second octet in 100..249 that this process claims (see simhelp.claim_subnet) and
    nobody listens on. Seeded by our PID so that two pytest processes rarely try the same
    one first."""
    return claim_subnet(100, 150, os.getpid() * 7 + next(_subnets))


def _fleets(
    tmp_path_factory: pytest.TempPathFactory, prefix: str, subnet: Callable[[], int]
) -> Iterator[Callable[..., SimFleet]]:
    """``make(n, **opts)`` -> a running SimFleet of n nodes (``opts`` as ``SimFleet.up``
    takes them) in its own state dir and subnet; every fleet made is taken down afterwards,
    failed test or not, and checked to leave nothing."""
    made: list[SimFleet] = []

    def make(n: int = 2, **opts: Any) -> SimFleet:
        fleet = up_claimed(subnet(), n, tmp_path_factory.mktemp(prefix), **opts)
        made.append(fleet)
        return fleet

    yield make
    failed: BaseException | None = None
    for fleet in made:
        try:
            down_checked(fleet)
        except BaseException as exc:  # the others still go down; the first failure is told
            failed = failed or exc
    if failed is not None:
        raise failed


@pytest.fixture
def sim_fleet_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., SimFleet]]:
    """``make(n=2)`` -> a fleet for this test alone (subnets 100..249)."""
    yield from _fleets(tmp_path_factory, "sim", free_subnet)


@pytest.fixture(scope="module")
def module_fleet_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., SimFleet]]:
    """``make(n)`` -> a fleet shared by one module's tests (subnets 20..89)."""
    if SIM_SKIP_REASON is not None:
        pytest.skip(SIM_SKIP_REASON)
    yield from _fleets(tmp_path_factory, "simmod", module_subnet)


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    """Three nodes shared by a module's read-only tests."""
    if SIM_SKIP_REASON is not None:
        pytest.skip(SIM_SKIP_REASON)
    fleet = up_claimed(free_subnet(), 3, tmp_path_factory.mktemp("sim"))
    try:
        yield fleet
    finally:
        fleet.down()
        release_subnet(fleet_subnet(fleet))


@pytest.fixture
def sim_subnet() -> Iterator[int]:
    """A free second octet for a fleet a test starts by other means (a subprocess),
    claimed until the test ends."""
    if SIM_SKIP_REASON is not None:
        pytest.skip(SIM_SKIP_REASON)
    subnet = free_subnet()
    yield subnet
    release_subnet(subnet)


@pytest.fixture
def nvidia_smi_fixtures() -> Path:
    """Real nvidia-smi outputs (see tests/data/nvidia-smi/README.md)."""
    return Path(__file__).parent / "data" / "nvidia-smi" / "h200"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli("run", "post-extraction", "-i", inv, "--json")`` -> CliResult: the real CLI,
    in-process, with its run records in this test's own state dir."""
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*argv: str | Path) -> CliResult:
        out, err = io.StringIO(), io.StringIO()
        env = Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"})
        t0 = time.monotonic()
        code = main([str(a) for a in argv], env)
        return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)

    return run
