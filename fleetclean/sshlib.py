"""paramiko, imported once for fleetclean, with its ``invoke`` import deferred.

paramiko imports invoke at start-up only to run ssh_config's ``Match exec`` lines; invoke in
turn imports asyncio and unittest.mock, about 40 ms: a tenth of a one-host teardown. Here
``invoke`` is a stand-in module that imports the real one on first use, so a config with
``Match exec`` still works and everything else starts faster.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


if "invoke" not in sys.modules:
    sys.modules["invoke"] = _Deferred("invoke")

import paramiko  # noqa: E402

__all__ = ["paramiko"]
