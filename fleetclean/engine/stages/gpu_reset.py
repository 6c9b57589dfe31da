"""Stage type ``gpu-reset`` (opt-in): ``nvidia-smi --gpu-reset`` for leaked GPU memory.

Resets only the GPUs (of ``gpus``: ``all`` or indexes such as ``"0,5"``) whose memory is
above ``max_used_mib``, has not fallen for ``quiet`` seconds (waiting up to ``wait`` for
killed processes' memory to settle) and is held by no process but protected daemons. A GPU
any other process holds is never touched, even when it also leaks. Where the driver refuses
because nvidia-persistenced holds the GPU, persistence mode is switched off for that GPU
during the reset and on again afterwards, on every path (success, failure, an interrupted
run: a trap). ``enabled: false`` makes the stage do nothing (``post-extraction`` runs it
with ``enabled: "{{ reset_leaked }}"``, false by default). Each GPU gets one change line:

>>> from fleetclean.engine.stages.base import Readings, StageReading
>>> r = Readings(stages={"5": StageReading("reset-leaked", "gpu-reset")})
>>> STAGE.records["reset"](r, ["5", "3", "ok", "512 MiB freed"])
>>> r.stages["5"].changes
['GPU3 reset: ok (512 MiB freed)']
>>> from fleetclean.engine.model import ResolvedStage
>>> STAGE.assignments(ResolvedStage("r", "gpu-reset", {"enabled": True, "gpus": "0 5",
...     "max_used_mib": 0, "quiet": 1, "wait": 10}))[:2]
['opt_enabled=1', "opt_gpus='0 5'"]
"""

from __future__ import annotations

import re
from typing import Any

from fleetclean.engine.checks import boolean, err, integer, number
from fleetclean.engine.model import Location, ResolvedStage
from fleetclean.engine.stages.base import Option, Readings, StageType, packaged, q, seconds_ms
from fleetclean.models import GpuReset


def gpu_selection(value: Any, where: Location | None, what: str) -> str:
    """``all``, or GPU indexes separated by commas or blanks (a YAML list too).

    >>> gpu_selection([0, 5], None, "gpus"), gpu_selection("all", None, "gpus")
    ('0 5', 'all')
    >>> gpu_selection("0,x", None, "gpus")
    Traceback (most recent call last):
    fleetclean.errors.VariableError: gpus must be 'all' or GPU indexes such as 0,5, not '0,x'
    """
    words = [str(v) for v in value] if isinstance(value, list) else re.split(r"[\s,]+",
                                                                             str(value).strip())
    if words == ["all"]:
        return "all"
    if not words or not all(w.isdigit() for w in words):
        raise err(where, f"{what} must be 'all' or GPU indexes such as 0,5, not {value!r}")
    return " ".join(str(int(w)) for w in words)


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    return [
        f"opt_enabled={int(o['enabled'])}",
        f"opt_gpus={q(o['gpus'])}",
        f"opt_max_used_mib={o['max_used_mib']}",
        f"opt_quiet_ms={seconds_ms(o['quiet'])}",
        f"opt_wait_ms={seconds_ms(o['wait'])}",
    ]


def _reset(r: Readings, a: list[str]) -> None:
    """``reset`` record: stage index, GPU index, ok|failed|refused|would, what happened."""
    r.stages[a[0]].changes.append(f"GPU{a[1]} reset: {a[2]} ({a[3]})")
    r.resets.append(GpuReset(int(a[1]), a[2], a[3]))


STAGE = StageType(
    name="gpu-reset",
    options=(
        Option("enabled", boolean, True),
        Option("gpus", gpu_selection, "all"),
        Option("max_used_mib", integer, 0),
        Option("quiet", number, 1.0),
        Option("wait", number, 10.0),
    ),
    assignments=_assignments,
    template=packaged("gpu-reset.sh"),
    # The driver's files, read by verify.sh's functions, give each GPU's device minor.
    libraries=("verify.sh",),
    records={"reset": _reset},
)
