"""Stage type ``signal``: signal the processes whose identity matches an ERE.

``match: identity`` (the default) matches what a process is: its title (``sglang::
scheduler_TP0``), else its executable and, for an interpreter, the module or script it runs
(``python3 -m sglang.launch_server``), never its file arguments (``tail -f sglang.log`` is
``tail``); ``match: cmdline`` matches anywhere in the command line. ``scope: related``
keeps only the matches that belong to what earlier stages stopped (``lib-match.sh``).
Takes each match's tree (descendants, process groups and sessions it leads), sends
``signal``, waits ``grace`` seconds, then KILLs what is left and waits ``kill_wait``.

>>> from fleetclean.engine.model import ResolvedStage
>>> for line in STAGE.assignments(ResolvedStage("stop", "signal", {
...         "pattern": "sglang", "match": "identity", "scope": "related", "signal": "TERM",
...         "grace": 10.0, "kill_wait": 3, "tree": True})):
...     print(line)
opt_pattern=sglang
opt_scope=related
opt_match=identity
opt_signal=TERM
opt_grace_ms=10000
opt_kill_wait_ms=3000
opt_tree=1
>>> match_mode("CmdLine", None, "match")
'cmdline'
>>> match_mode("argv", None, "match")
Traceback (most recent call last):
fleetclean.errors.VariableError: match must be identity or cmdline, not 'argv' (identity ...)
"""

from __future__ import annotations

from typing import Any

from fleetclean.engine.checks import (
    boolean,
    check_target_pattern,
    err,
    number,
    signal_name,
    text,
)
from fleetclean.engine.model import Location, ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q, seconds_ms

MATCH_MODES = ("identity", "cmdline")
SCOPES = ("all", "related")


def _one_of(choices: tuple[str, ...], hint: str) -> Any:
    def check(value: Any, where: Location | None, what: str) -> str:
        word = text(value, where, what).strip().lower()
        if word not in choices:
            raise err(where, f"{what} must be {' or '.join(choices)}, not {value!r}", hint)
        return word
    return check


match_mode = _one_of(MATCH_MODES, "identity (the default) matches what a process is: its "
                     "title, executable, module or script; cmdline matches anywhere in its "
                     "command line, file arguments included")
scope_check = _one_of(SCOPES, "related takes a match only when it holds a GPU or belongs to "
                      "what an earlier stage stopped; all takes every match")


def signalling_options(grace: float) -> tuple[Option, ...]:
    """The options of every stage type that signals processes (signal, gpu-holders)."""
    return (
        Option("match", match_mode, "identity"),
        Option("signal", signal_name, "TERM"),
        Option("grace", number, grace),
        Option("kill_wait", number, 3),
        Option("tree", boolean, True),
    )


def signalling_assignments(o: dict[str, Any]) -> list[str]:
    """The shell lines those options become; ``fc_act_on_targets`` reads them."""
    return [
        f"opt_match={q(o['match'])}",
        f"opt_signal={q(o['signal'])}",
        f"opt_grace_ms={seconds_ms(o['grace'])}",
        f"opt_kill_wait_ms={seconds_ms(o['kill_wait'])}",
        f"opt_tree={int(o['tree'])}",
    ]


def _assignments(stage: ResolvedStage) -> list[str]:
    return [f"opt_pattern={q(stage.options['pattern'])}",
            f"opt_scope={q(stage.options['scope'])}",
            *signalling_assignments(stage.options)]


STAGE = StageType(
    name="signal",
    options=(Option("pattern", check_target_pattern), Option("scope", scope_check, "all"),
             *signalling_options(grace=10)),
    assignments=_assignments,
    template=packaged("signal.sh"),
    libraries=("lib-match.sh", "lib-kill.sh", "owner.sh", "owner-act.sh"),
)
