"""The worked examples in the module docstrings stay true."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from fleetclean.inventory import ini_file, limit, load, ranges, ssh_settings


@pytest.mark.parametrize("module", [load, ini_file, limit, ranges, ssh_settings])
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
