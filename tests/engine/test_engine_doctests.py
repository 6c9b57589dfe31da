"""The worked examples in the engine's and the parser's docstrings stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import fleetclean.engine

# Every engine module (a new stage type's included, without listing it here), and the
# parser that reads the scripts' records back.
MODULES = [
    "fleetclean.engine",
    *(m.name for m in pkgutil.walk_packages(fleetclean.engine.__path__, "fleetclean.engine.")),
    "fleetclean.results.parse",
    "fleetclean.results.nvsmi",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no >>> example"
    assert result.failed == 0
