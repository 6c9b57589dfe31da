"""Stage type ``signal``: signal the processes whose command line matches an ERE.

Takes each match's tree (descendants, process groups and sessions it leads), sends
``signal``, waits ``grace`` seconds, then KILLs what is left and waits ``kill_wait``.

>>> from fleetclean.engine.model import ResolvedStage
>>> for line in STAGE.assignments(ResolvedStage("stop", "signal", {
...         "pattern": "sglang", "signal": "TERM", "grace": 10.0, "kill_wait": 3, "tree": True})):
...     print(line)
opt_pattern=sglang
opt_signal=TERM
opt_grace_ms=10000
opt_kill_wait_ms=3000
opt_tree=1
"""

from __future__ import annotations

from typing import Any

from fleetclean.engine.checks import boolean, check_target_pattern, number, signal_name
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q, seconds_ms


def signalling_options(grace: float) -> tuple[Option, ...]:
    """The options of every stage type that signals processes (signal, gpu-holders)."""
    return (
        Option("signal", signal_name, "TERM"),
        Option("grace", number, grace),
        Option("kill_wait", number, 3),
        Option("tree", boolean, True),
    )


def signalling_assignments(o: dict[str, Any]) -> list[str]:
    """The shell lines those options become; ``fc_act_on_targets`` reads them."""
    return [
        f"opt_signal={q(o['signal'])}",
        f"opt_grace_ms={seconds_ms(o['grace'])}",
        f"opt_kill_wait_ms={seconds_ms(o['kill_wait'])}",
        f"opt_tree={int(o['tree'])}",
    ]


def _assignments(stage: ResolvedStage) -> list[str]:
    return [f"opt_pattern={q(stage.options['pattern'])}",
            *signalling_assignments(stage.options)]


STAGE = StageType(
    name="signal",
    options=(Option("pattern", check_target_pattern), *signalling_options(grace=10)),
    assignments=_assignments,
    template=packaged("signal.sh"),
    libraries=("lib-kill.sh", "owner.sh", "owner-act.sh"),
)
