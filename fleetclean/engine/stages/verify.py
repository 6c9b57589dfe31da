"""The verification (a playbook's ``verify:``): poll nvidia-smi until every GPU uses at
most ``max_used_mib`` or ``timeout`` passes, then report GPUs, compute apps and holders.

Not a stage type a playbook lists under ``stages:``, but declared the same way: options,
shell assignments, template, and the records only it writes (``nvsmi``, ``gpu``, ``app``,
``holder``, ``verify``).

``settle``: when a killed GPU holder's parent lives on, a clean read counts only once this
long has passed since the last signal; a holder that its supervisor respawns (systemd's
default RestartSec is 100 ms, plus the start-up of the process) shows up there as dirty.

>>> from fleetclean.engine.stages.base import Readings
>>> r = Readings()
>>> VERIFY.records["verify"](r, ["dirty", "0", "30000", "1 GPU(s) above 0 MiB"])
>>> r.verify, r.verify_message
('dirty', '1 GPU(s) above 0 MiB')
"""

from __future__ import annotations

from fleetclean.engine.checks import integer, number, positive_number
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, Readings, StageType, packaged, seconds_ms


def _assignments(stage: ResolvedStage) -> list[str]:
    o = stage.options
    return [
        f"opt_max_used_mib={o['max_used_mib']}",
        f"opt_timeout_ms={seconds_ms(o['timeout'])}",
        f"opt_interval_s={o['interval']:g}",
        f"opt_settle_ms={seconds_ms(o['settle'])}",
    ]


def _nvsmi(r: Readings, a: list[str]) -> None:
    text = a[1].strip() or "(no output)"
    r.nvsmi = text if a[0] == "127" else f"nvidia-smi failed (exit {a[0]}): {text}"


def _gpu(r: Readings, a: list[str]) -> None:
    r.gpu_lines.append(a[0])


def _app(r: Readings, a: list[str]) -> None:
    r.app_lines.append(a[0])


def _holder(r: Readings, a: list[str]) -> None:
    r.holders.append((int(a[0]), a[1], a[2]))


def _verify(r: Readings, a: list[str]) -> None:
    r.verify, r.verify_message = a[0], a[3]
    r.current = None


VERIFY = StageType(
    name="verify",
    options=(
        Option("max_used_mib", integer, 0),
        Option("timeout", number, 30),
        Option("interval", positive_number, 0.2),
        Option("settle", number, 1.0),
    ),
    assignments=_assignments,
    template=packaged("verify.sh"),
    records={"nvsmi": _nvsmi, "gpu": _gpu, "app": _app, "holder": _holder, "verify": _verify},
    aliases={"verify_timeout": "timeout", "poll_interval": "interval"},
)
