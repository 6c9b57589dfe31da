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

Two more of their imports cost a run's start-up for nothing fleetclean uses, and are
answered the same way, for the length of that first import only (``-X importtime`` on this
project's 2-core machine):

- paramiko's package sets ``__version__`` from ``importlib.metadata.version("paramiko")``
  (paramiko/__init__.py since paramiko 4), and importing ``importlib.metadata`` (email,
  zipfile, csv, tempfile...) costs 14-19 ms, its search of sys.path 2 ms more; the same
  cost other projects removed from their own imports, e.g.
  https://github.com/pygments/pygments/pull/3157. While paramiko is first imported,
  ``importlib.metadata`` is a stand-in whose ``version`` reads the version from the name of
  the package's one ``<name>-<version>.dist-info`` beside it (what pip and uv install),
  and asks the real module in any other case. The version is what paramiko puts in its
  SSH banner (``paramiko_5.1.0``), so it must be the real one.
- invoke imports its vendored copy of PyYAML 5.4 (``invoke.vendor.yaml``: 13 ms of pure
  Python) to read invoke and fabric config files, and falls back to an installed ``yaml``
  where a packager removed the copy (invoke/util.py). fleetclean already has PyYAML loaded
  for its playbooks: while invoke is first imported, ``invoke.vendor.yaml`` is that one,
  which reads the same files (invoke only calls ``yaml.safe_load``).

>>> paramiko.SSHClient.__module__
'paramiko.client'
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["fabric", "paramiko"]

_MOCK = "unittest.mock"
_METADATA = "importlib.metadata"
_VENDORED_YAML = "invoke.vendor.yaml"


class _StandIn(types.ModuleType):
    """A stand-in module: what it does not define is the real module's."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system's own questions (``__path__``)
            raise AttributeError(name)
        return getattr(_real(self.__name__), name)


def _real(module: str) -> types.ModuleType:
    """The real ``module``, its stand-in put out of the way."""
    if isinstance(sys.modules.get(module), _StandIn):
        del sys.modules[module]
    return importlib.import_module(module)


class _DeferredMock:
    """``invoke.context.Mock``: a real ``unittest.mock.Mock``, imported when first made."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _real(_MOCK).Mock(*args, **kwargs)


def _installed_version(name: str) -> str:
    """``importlib.metadata.version(name)``, from the name of the one ``<name>-<version>
    .dist-info`` directory beside package ``name`` where there is one; else the real
    module's answer."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    where = spec.submodule_search_locations if spec is not None else None
    if where:
        site = os.path.dirname(next(iter(where)))
        prefix = name.replace("-", "_") + "-"
        with contextlib.suppress(OSError):
            found = [d for d in os.listdir(site)
                     if d.startswith(prefix) and d.endswith(".dist-info")]
            if len(found) == 1:
                return found[0][len(prefix):-len(".dist-info")]
    return str(_real(_METADATA).version(name))


def _stand_ins() -> dict[str, types.ModuleType]:
    """What stands in while fabric and paramiko are first imported (the module docstring
    says why): nothing for a module that is in already, or whose importer is (a test run
    has unittest.mock; another library may have loaded invoke first)."""
    mine: dict[str, types.ModuleType] = {}
    if "invoke" not in sys.modules and _MOCK not in sys.modules:
        mine[_MOCK] = _StandIn(_MOCK)
        mine[_MOCK].__dict__["Mock"] = _DeferredMock
    if "paramiko" not in sys.modules and _METADATA not in sys.modules:
        mine[_METADATA] = _StandIn(_METADATA)
        mine[_METADATA].__dict__["version"] = _installed_version
    if "invoke" not in sys.modules and _VENDORED_YAML not in sys.modules:
        with contextlib.suppress(ImportError):
            import yaml

            mine[_VENDORED_YAML] = yaml
    return mine


@contextmanager
def _standing_in() -> Iterator[None]:
    """The stand-ins in ``sys.modules`` for the length of the block; each gone after it
    (where nothing replaced it meanwhile), so that a later import gets the real module."""
    mine = _stand_ins()
    sys.modules.update(mine)
    try:
        yield
    finally:
        for name, module in mine.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


with _standing_in():
    import fabric
    import paramiko
