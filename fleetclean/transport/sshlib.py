"""fabric and paramiko, imported here and nowhere else in fleetclean.

Every module that uses them takes them from here (``from fleetclean.transport.sshlib import
paramiko``; ruff's banned-api rule refuses ``import paramiko`` elsewhere), so that the first
import of either, whichever module asks first, goes through ``_without_invoke_mock``.

Why: both pull in invoke (fabric is built on it; ``paramiko.config`` imports it whole for
``Match exec``, a hard dependency since paramiko 4: https://github.com/paramiko/paramiko/pull/2543,
declined), and invoke's package imports ``invoke.context``, which imports
``unittest.mock`` for ``MockContext``, its test double. ``unittest.mock`` brings
``unittest``, ``asyncio`` and ``ssl``: 25-40 ms of an SSH run's start-up (``-X importtime``;
invoke's start-up: https://github.com/pyinvoke/invoke/issues/775), for a class fleetclean
never uses. While invoke's package is first imported, ``unittest.mock`` is a stand-in whose
``Mock`` makes a real one when called, so ``MockContext`` still works for a library user who
wants it; the stand-in is gone from ``sys.modules`` once invoke is imported, and any other
name asked of it meanwhile (another thread) is the real module's.

>>> paramiko.SSHClient.__module__
'paramiko.client'
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["fabric", "paramiko"]

_MOCK = "unittest.mock"


class _DeferredMock:
    """``invoke.context.Mock``: a real ``unittest.mock.Mock``, imported when first made."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _real_mock().Mock(*args, **kwargs)


def _real_mock() -> types.ModuleType:
    if isinstance(sys.modules.get(_MOCK), _StandIn):
        del sys.modules[_MOCK]
    return importlib.import_module(_MOCK)


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system's own questions (``__path__``)
            raise AttributeError(name)
        return getattr(_real_mock(), name)


@contextmanager
def _without_invoke_mock() -> Iterator[None]:
    if "invoke" in sys.modules or _MOCK in sys.modules:
        yield  # nothing left to save: invoke is in, or unittest.mock (a test run) is
        return
    stand_in = _StandIn(_MOCK)
    stand_in.__dict__["Mock"] = _DeferredMock
    sys.modules[_MOCK] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_MOCK) is stand_in:
            del sys.modules[_MOCK]


with _without_invoke_mock():
    import fabric
    import paramiko
