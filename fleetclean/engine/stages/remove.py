"""Stage type ``remove``: delete paths; a wildcard written in the playbook is a glob.

Each resolved path comes with its glob flag: only wildcards written in the playbook
itself count, so a variable's value is always a literal path (``-e dump_dir='*'``
removes nothing else).

>>> from fleetclean.engine.model import Location
>>> at = Location("pb.yaml", 1, 1)
>>> resolve_paths(["{{ d }}/*", "{{ d }}"], {"d": "/dev/shm/x*"}, at, "paths", {})
[('/dev/shm/x*/*', True), ('/dev/shm/x*', False)]
>>> resolve_paths("/dev", {}, at, "paths", {})
Traceback (most recent call last):
fleetclean.errors.VariableError: pb.yaml:1:1: paths: refusing '/dev': ... top-level directory ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetclean.engine.checks import boolean, deep_paths
from fleetclean.engine.model import Location, ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q
from fleetclean.engine.substitute import TEMPLATE, substitute


def resolve_paths(raw: Any, variables: Mapping[str, Any], where: Location, what: str,
                  env: dict[str, str]) -> list[tuple[str, bool]]:
    """``(path, is_glob)`` for each path, checked by :func:`deep_paths`."""
    paths = deep_paths(substitute(raw, variables, where), where, what)
    items = raw if isinstance(raw, list) else [raw]
    if len(items) != len(paths):  # one "{{ list_var }}" became several literal paths
        return [(p, False) for p in paths]
    return [(p, isinstance(i, str) and any(c in TEMPLATE.sub("", i) for c in "*?["))
            for p, i in zip(paths, items, strict=True)]


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    paths = " ".join(q(p) for p, _ in o["paths"])
    globs = " ".join(str(int(g)) for _, g in o["paths"])
    return [f"opt_paths=({paths})", f"opt_globs=({globs})",
            f"opt_missing_ok={int(o['missing_ok'])}"]


STAGE = StageType(
    name="remove",
    options=(Option("paths", deep_paths, resolver=resolve_paths),
             Option("missing_ok", boolean, False)),
    assignments=_assignments,
    template=packaged("remove.sh"),
)
