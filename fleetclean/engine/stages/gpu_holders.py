"""Stage type ``gpu-holders``: signal every process holding a GPU.

Holders come from nvidia-smi's compute apps (the verification's read, which it takes as
its own first read where no later stage may have changed a GPU) and from ``/dev/nvidiaN``
file descriptors, minus protected processes; ``filter`` (an ERE, empty for all) narrows
them by identity (or, ``match: cmdline``, by command line; see the ``signal`` stage type).

>>> from fleetclean.engine.model import ResolvedStage
>>> STAGE.assignments(ResolvedStage("free", "gpu-holders", {
...     "filter": "", "match": "identity", "signal": "TERM", "grace": 5.0, "kill_wait": 3.0,
...     "tree": False}))[:3]
["opt_filter=''", 'opt_match=identity', 'opt_signal=TERM']
"""

from __future__ import annotations

from fleetclean.engine.checks import ere_or_empty
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, StageType, packaged, q
from fleetclean.engine.stages.signal import signalling_assignments, signalling_options


def _assignments(stage: ResolvedStage) -> list[str]:
    return [f"opt_filter={q(stage.options['filter'])}",
            *signalling_assignments(stage.options)]


STAGE = StageType(
    name="gpu-holders",
    options=(Option("filter", ere_or_empty, ""), *signalling_options(grace=5)),
    assignments=_assignments,
    template=packaged("gpu-holders.sh"),
    # verify.sh: its holders come from the verification's read, kept for it.
    libraries=("lib-match.sh", "lib-kill.sh", "owner.sh", "owner-act.sh", "verify.sh"),
)
