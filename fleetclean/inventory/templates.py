"""The one kind of Jinja template an inventory's connection variables hold: variables.

``ansible_host: "{{ inventory_hostname }}.ib.cluster"`` in group_vars/ (every node's
InfiniBand name), ``ansible_user: "{{ admin_user }}"`` with ``admin_user`` set beside it:
Ansible renders them with the host's variables. fleetclean renders that much, a text with
``{{ NAME }}`` parts, each NAME ``inventory_hostname``, ``inventory_hostname_short`` or one
of the host's own variables whose value is a text or a number (itself rendered so, a few
levels deep); and nothing more. A filter (``{{ x | lower }}``), an expression, a
``{% ... %}`` block or a variable the host does not have gives ``Unrendered`` with the
reason: its value would be a guess, and a guessed host name or user reaches another
machine or account than Ansible does.

>>> render("{{ inventory_hostname }}.ib", "gpu01.lab", {})
'gpu01.lab.ib'
>>> render("{{inventory_hostname_short}}-{{ site }}", "gpu01.lab", {"site": "{{ dc }}a",
...        "dc": 7})
'gpu01-7a'
>>> render("{{ user | lower }}", "gpu01", {"user": "Ops"})
Traceback (most recent call last):
...
fleetclean.inventory.templates.Unrendered: '{{ user | lower }}' is more than a variable
>>> render("{{ admin_user }}", "gpu01", {})
Traceback (most recent call last):
...
fleetclean.inventory.templates.Unrendered: admin_user is not set for this host
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_DEPTH = 8  # a variable whose value names itself, directly or not, stops here

_PART = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*")


class Unrendered(ValueError):
    """A template this module does not render; the message says why."""


def is_template(text: str) -> bool:
    """Whether Ansible would render ``text`` (it holds Jinja's delimiters)."""
    return "{{" in text or "{%" in text or "{#" in text


def render(text: str, host: str, variables: Mapping[str, object], depth: int = 0,
           used: set[str] | None = None) -> str:
    """``text`` with each ``{{ NAME }}`` replaced for ``host`` (see the module); raises
    ``Unrendered``. ``used``: gets the name of every variable the text read (a password's
    template makes them secrets too)."""
    if depth > MAX_DEPTH:
        raise Unrendered(f"{text!r} refers to itself (through {MAX_DEPTH} variables)")
    if "{%" in text or "{#" in text:
        raise Unrendered(f"{text!r} holds a Jinja block or comment")
    out: list[str] = []
    end = 0
    for part in _PART.finditer(text):
        name = _NAME.fullmatch(part.group(1))
        if name is None:
            raise Unrendered(f"{part.group(0)!r} is more than a variable")
        if used is not None:
            used.add(name.group(1))
        out += [text[end:part.start()], _value(name.group(1), host, variables, depth, used)]
        end = part.end()
    rest = text[end:]
    if "{{" in rest or "}}" in rest:
        raise Unrendered(f"{text!r} has an unclosed {{{{ }}}}")
    return "".join(out) + rest


def _value(name: str, host: str, variables: Mapping[str, object], depth: int,
           used: set[str] | None) -> str:
    if name == "inventory_hostname":
        return host
    if name == "inventory_hostname_short":
        return host.split(".", 1)[0]
    if variables.get(name) is None:  # absent, or null (`admin_user:` with no value)
        raise Unrendered(f"{name} is not set for this host")
    value = variables[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Unrendered(f"{name} is not a text or a number")
    text = str(value)
    return render(text, host, variables, depth + 1, used) if is_template(text) else text
