"""The worked examples in the module docstrings stay true."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from fleetclean import inventory, inventory_ini, limit, ranges, sshconfig


@pytest.mark.parametrize("module", [inventory, inventory_ini, limit, ranges, sshconfig])
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
