"""Every module's docstring examples run, and pass (the sim modules too: Linux imports)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import fleetclean

FLAGS = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.NORMALIZE_WHITESPACE

# Programs, not modules: importing one runs it (or needs its own sys.path), so they must
# carry no examples, which is checked on their source instead.
SCRIPTS = {"fleetclean.__main__", "fleetclean.sim.node_init", "fleetclean.sim.programs"}


def _modules() -> list[str]:
    names = [fleetclean.__name__]
    for info in pkgutil.walk_packages(fleetclean.__path__, prefix="fleetclean."):
        # The fake sglang package is a program run inside simulated nodes, not a module.
        if ".fakepkgs" not in info.name:
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_pass(name: str) -> None:
    if name in SCRIPTS:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        with open(spec.origin) as source:
            assert ">>>" not in source.read(), f"{name} is run as a program: no examples"
        return
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
