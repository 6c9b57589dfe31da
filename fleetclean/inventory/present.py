"""``fleetclean inventory``: hosts as the ``--json`` contract or a table for people.

>>> from fleetclean.models import Host
>>> inventory_json([Host("gpu01", "10.0.0.1", vars={"when": float("nan")})])["hosts"][0]["vars"]
{'when': 'nan'}
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

from fleetclean.models import Host
from fleetclean.nodeset import fold

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["inventory_json", "render_inventory_table"]


def inventory_json(hosts: list[Host]) -> dict[str, Any]:
    """``fleetclean inventory --json``: the DESIGN.md contract, values made JSON-safe."""
    return {
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "port": h.port,
                "user": h.user,
                "key": h.key,
                "connection": h.connection,
                "become": h.become,
                "groups": list(h.groups),
                "vars": _plain(h.vars),
            }
            for h in hosts
        ]
    }


def _plain(value: Any) -> Any:
    """YAML and INI can give dates, sets, bytes, NaN: write them as JSON can."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=str)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def render_inventory_table(hosts: list[Host]) -> RenderableType:
    """The human ``fleetclean inventory`` view: one row per host with where and how to
    connect, then the playbook variables: those every host shares once, the others once per
    set of hosts that has them (``h200-[01-07].lab: grace=10``), so that 80 columns suffice.
    Columns empty for every host are left out.
    """
    # Imported here: every command loads this package, only this one draws with rich.
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    shared = {
        k: v for k, v in (hosts[0].vars.items() if hosts else ())
        if all(k in h.vars and h.vars[k] == v for h in hosts)
    }
    rows = [{
        "host": h.name,
        "address": h.address if h.port is None else f"{h.address}:{h.port}",
        "user": h.user or "",
        "via": "local" if h.connection == "local" else (h.proxy_jump or ""),
        "become": (h.become_user or "root") if h.become else "",
        "groups": ",".join(h.groups),
    } for h in hosts]
    table = Table(
        title=f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    columns = [c for c in rows[0] if c == "host" or any(r[c] for r in rows)] if rows else []
    for column in columns:
        table.add_column(column, no_wrap=True)
    for r in rows:
        table.add_row(*(r[c] for c in columns))
    lines: list[RenderableType] = [table]
    if shared:
        lines.append(Text("vars, every host: " + _vars_text(shared)))
    by_vars: dict[str, list[str]] = {}
    for h in hosts:
        own = _vars_text({k: v for k, v in h.vars.items() if k not in shared})
        if own:
            by_vars.setdefault(own, []).append(h.name)
    for text, names in by_vars.items():
        lines.append(Text(f"vars, {fold(names)}: {text}"))
    return Group(*lines)


def _vars_text(variables: dict[str, Any]) -> str:
    return " ".join(f"{k}={_var_text(v)}" for k, v in variables.items())


def _var_text(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)

