"""Acting through the owner: one playbook variable per owner kind says what a stage does
to a target that the kind runs (``owner.sh`` names the owner, ``owner-act.sh`` acts).

``stop``: through the owner (``systemctl stop`` the unit, ``docker stop`` or ``podman stop``
the container, ``scancel`` the Slurm job), then signals for whatever of it is left;
``signal``: signals, as for any process; ``refuse``: never signalled, the host is dirty
and the reason says whom to ask. Not every action fits every kind: a pod cannot be
stopped from the node (its controller recreates it: that is the cluster's call), and a
plain process has no owner to refuse for.

>>> actions({"owner_docker": "signal"}, {})["docker"], actions({}, {})["kubernetes"]
('signal', 'refuse')
>>> actions({"owner_kubernetes": "stop"}, {})
Traceback (most recent call last):
fleetclean.errors.VariableError: owner_kubernetes must be one of refuse, signal, not 'stop'...
>>> never_stop({"never_stop_units": "jupyter, triton-*"}, {})
('jupyter.service', 'triton-*')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fleetclean.engine.checks import err, no_nul
from fleetclean.engine.model import Location

DEFAULTS: dict[str, str] = {
    "systemd": "stop", "docker": "stop", "podman": "stop", "kubernetes": "refuse",
    "slurm": "refuse",
    "tmux": "signal", "screen": "signal", "plain": "signal",
}
"""The action per owner kind when no variable says otherwise (issue 14)."""

ALLOWED: dict[str, tuple[str, ...]] = {
    "systemd": ("stop", "signal", "refuse"), "docker": ("stop", "signal", "refuse"),
    "podman": ("stop", "signal", "refuse"),
    "kubernetes": ("refuse", "signal"), "slurm": ("refuse", "signal", "stop"),
    "tmux": ("signal", "refuse"), "screen": ("signal", "refuse"), "plain": ("signal",),
}

VARIABLES: dict[str, Any] = {f"owner_{k}": v for k, v in DEFAULTS.items()}
VARIABLES["never_stop_units"] = []

_UNIT_WORD = re.compile(r"^[A-Za-z0-9@._:*?\[\]\\-]+$")


def actions(variables: Mapping[str, Any], where: Mapping[str, Location]) -> dict[str, str]:
    """The action for every owner kind, from ``owner_<kind>`` variables (defaults for the
    rest); a value that is not one of the kind's actions is bad input naming it."""
    out = {}
    for kind, default in DEFAULTS.items():
        name = f"owner_{kind}"
        value = variables.get(name, default)
        word = value.strip().lower() if isinstance(value, str) else value
        if word not in ALLOWED[kind]:
            raise err(where.get(name),
                      f"{name} must be one of {', '.join(ALLOWED[kind])}, not {value!r}",
                      f"e.g. -e {name}={ALLOWED[kind][0]}")
        out[kind] = str(word)
    return out


def never_stop(variables: Mapping[str, Any], where: Mapping[str, Location]) -> tuple[str, ...]:
    """``never_stop_units``: units never stopped through systemd whatever matches them
    (their processes are signalled one by one instead), as a list or a comma-separated
    string; a name without a type suffix means a service; shell globs allowed."""
    value = variables.get("never_stop_units", [])
    at = where.get("never_stop_units")
    if isinstance(value, str):
        items = [w for w in re.split(r"[\s,]+", value) if w]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value if v.strip()]
    else:
        raise err(at, "never_stop_units must be a list of unit names or a comma-separated "
                      f"string, not {value!r}")
    out = []
    for item in items:
        no_nul(item, at, "never_stop_units")
        if not _UNIT_WORD.match(item):
            raise err(at, f"never_stop_units: {item!r} is not a unit name",
                      "e.g. jupyter.service or triton-*")
        out.append(item if "." in item or item.endswith("*") else f"{item}.service")
    return tuple(dict.fromkeys(out))
