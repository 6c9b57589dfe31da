"""Strict ``{{ name }}`` substitution: no filters, no expressions, no undefined names.

>>> substitute("{{ dump_dir }}/x", {"dump_dir": "/dev/shm/hs"}, where=None)
'/dev/shm/hs/x'
>>> substitute("{{ grace }}", {"grace": 10}, where=None)
10
>>> substitute("{{ dump_dri }}", {"dump_dir": "/dev/shm/hs"}, where=None)
Traceback (most recent call last):
fleetclean.errors.VariableError: undefined variable 'dump_dri' (did you mean 'dump_dir'?)

Substitution only produces *values*; the renderer shell-quotes every one of them and the
stage bash reads them as ``"$var"``, so no value can ever become code.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from fleetclean.engine.checks import err, scalar_text
from fleetclean.engine.model import VAR_NAME, Location

TEMPLATE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
"""One ``{{ ... }}`` reference; group 1 is what is between the braces."""
_WHOLE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def lookup(name: str, variables: Mapping[str, Any], where: Location | None) -> Any:
    """The value of one variable, or a VariableError suggesting the close name."""
    if name not in variables:
        close = difflib.get_close_matches(name, list(variables), n=1)
        hint = (f"did you mean '{close[0]}'?" if close
                else f"set it with -e {name}=VALUE or in the inventory")
        raise err(where, f"undefined variable '{name}'", hint)
    return variables[name]


def reference_name(match: re.Match[str], where: Location | None) -> str:
    """The variable a :data:`TEMPLATE` match names; anything but a bare name is an error."""
    name = match.group(1).strip()
    if not VAR_NAME.match(name):
        raise err(where, f"unsupported expression '{{{{{match.group(1)}}}}}'",
                  "only {{ name }} is supported: no filters, no expressions")
    return name


def substitute(value: Any, variables: Mapping[str, Any], where: Location | None) -> Any:
    """Replace ``{{ name }}`` in strings (recursively in lists). A string that is exactly
    one reference takes the variable's own type (``"{{ grace }}"`` -> ``10``)."""
    if isinstance(value, list):
        return [substitute(v, variables, where) for v in value]
    if not isinstance(value, str):
        return value
    whole = _WHOLE.match(value)
    if whole:
        return lookup(whole.group(1), variables, where)

    def one(match: re.Match[str]) -> str:
        name = reference_name(match, where)
        return scalar_text(lookup(name, variables, where), name, where)

    out = TEMPLATE.sub(one, value)
    if "{{" in TEMPLATE.sub("", value) or "}}" in TEMPLATE.sub("", value):
        raise err(where, f"unbalanced '{{{{' or '}}}}' in {value!r}")
    return out
