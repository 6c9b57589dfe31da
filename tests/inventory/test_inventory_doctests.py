"""The worked examples in the docstrings of every inventory module (and nodeset) stay true."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fleetclean.inventory

MODULES = [
    "fleetclean.nodeset",
    *(m.name for m in pkgutil.iter_modules(fleetclean.inventory.__path__, "fleetclean.inventory.")),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
