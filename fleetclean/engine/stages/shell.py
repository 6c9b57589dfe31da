"""Stage type ``shell``: run a command with bash, its variables in the environment.

``{{ x }}`` in the command becomes ``"${FC_VAR_x}"`` and the value travels in the
environment (``opt_env``): a value is never spliced into code.

>>> from fleetclean.engine.model import Location
>>> env: dict[str, str] = {}
>>> shell_command('ls {{ d }} "{{ d }}/x"', {"d": "/a b"}, Location("p", 1, 1), "command", env)
'ls "${FC_VAR_d}" "${FC_VAR_d}/x"'
>>> env
{'FC_VAR_d': '/a b'}
>>> shell_command("echo '{{ d }}'", {"d": "x"}, Location("p", 1, 1), "command", {})
Traceback (most recent call last):
fleetclean.errors.VariableError: p:1:1: shell: '{{ d }}' is inside single quotes, where ...
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fleetclean.engine.checks import err, no_nul, number, scalar_text, text
from fleetclean.engine.model import VAR_NAME, Location, ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q
from fleetclean.engine.substitute import TEMPLATE, lookup


def shell_command(raw: Any, variables: Mapping[str, Any], where: Location, what: str,
                  env: dict[str, str]) -> str:
    """The command with each ``{{ x }}`` replaced by a quoted ``${FC_VAR_x}``; the value
    goes into ``env``."""
    if not isinstance(raw, str) or not raw.strip():
        raise err(where, "shell: command must be a non-empty string")

    quoted, double_quoted = _quoted_offsets(raw)

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if not VAR_NAME.match(name):
            raise err(where, f"unsupported expression '{{{{{match.group(1)}}}}}'",
                      "only {{ name }} is supported")
        if match.start() in quoted:
            # '{{ x }}' would become '"${FC_VAR_x}"': the literal text, never the value.
            raise err(where, f"shell: '{{{{ {name} }}}}' is inside single quotes, where bash "
                             "would never expand it",
                      f"write {{{{ {name} }}}} unquoted: it is substituted as one quoted word")
        value = lookup(name, variables, where)
        if isinstance(value, list):
            value = " ".join(scalar_text(v, name, where) for v in value)
        env[f"FC_VAR_{name}"] = no_nul(scalar_text(value, name, where), where, name)
        if match.start() in double_quoted:  # already inside "...": quotes would close it
            return f"${{FC_VAR_{name}}}"
        return f'"${{FC_VAR_{name}}}"'

    return TEMPLATE.sub(one, raw)


def _quoted_offsets(command: str) -> tuple[set[int], set[int]]:
    """Offsets of ``command`` that bash reads inside '...' and inside "..." (backslashes
    tracked, so "it's" and \\' do not open a single-quoted string)."""
    inside: set[int] = set()
    in_double: set[int] = set()
    single = double = escaped = False
    for i, ch in enumerate(command):
        if double:
            in_double.add(i)
        if single:
            if ch == "'":
                single = False
            else:
                inside.add(i)
        elif escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            double = not double
        elif ch == "'" and not double:
            single = True
    return inside, in_double


def _assignments(stage: ResolvedStage) -> list[str]:
    env = " ".join(f"{q(k)} {q(v)}" for k, v in sorted(stage.env.items()))
    return [
        f"opt_command={q(stage.options['command'])}",
        f"opt_env=({env})",
        f"opt_timeout_s={stage.options['timeout']:g}",
    ]


STAGE = StageType(
    name="shell",
    options=(Option("command", text, resolver=shell_command), Option("timeout", number, 300)),
    assignments=_assignments,
    template=packaged("shell.sh"),
)
