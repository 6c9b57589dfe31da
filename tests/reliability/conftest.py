"""Fixtures of the reliability suite: the CLI in-process, module-scoped fleets.

The suite drives the real CLI (``main(argv, Env)``) against simulated nodes over real SSH.
Every fleet is started through a fixture that takes it down, failed test or not.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from relhelp import Cli, CliResult, module_subnet

from fleetclean.cli import Env, main

SIM_SKIP: str | None = None
try:
    from fleetclean.errors import SimError
    from fleetclean.sim import SimFleet
    from fleetclean.sim import pids as sim_pids
    from fleetclean.sim.fleet import check_host

    check_host()
except (ImportError, SimError) as exc:  # pragma: no cover - depends on the machine
    SIM_SKIP = f"simulated fleet unavailable: {exc}"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli("run", "post-extraction", "-i", inv, "--json")`` -> CliResult."""
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*argv: str | Path) -> CliResult:
        out, err = io.StringIO(), io.StringIO()
        env = Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"})
        t0 = time.monotonic()
        code = main([str(a) for a in argv], env)
        return CliResult(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)

    return run


@pytest.fixture(scope="module")
def module_fleet_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[int], SimFleet]]:
    """``make(n)`` -> a fleet shared by one module's tests; all down at module end."""
    if SIM_SKIP is not None:
        pytest.skip(SIM_SKIP)
    made: list[SimFleet] = []

    def make(n: int) -> SimFleet:
        fleet = SimFleet.up(n, tmp_path_factory.mktemp("simmod"), subnet=module_subnet())
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        recorded = sim_pids.load(fleet.layout.pid_file)
        fleet.down()
        left = [e for e in recorded if sim_pids.is_alive(e)]
        assert not left, f"simulator processes left after down: {left}"
