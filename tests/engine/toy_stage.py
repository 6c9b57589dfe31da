"""A toy stage type, declared the way a real one is: this module plus ``toy.sh``.

``word`` (required) is said ``times`` times; each saying is a ``toy`` record that the
parser reads back, through :data:`STAGE`'s reader, as one of the stage's changes.
"""

from __future__ import annotations

from pathlib import Path

from fleetclean.engine.checks import integer, text
from fleetclean.engine.model import ResolvedStage
from fleetclean.engine.stages.base import Option, Readings, StageType, q


def _assignments(stage: ResolvedStage) -> list[str]:
    return [f"opt_word={q(stage.options['word'])}", f"opt_times={stage.options['times']}"]


def _toy(readings: Readings, fields: list[str]) -> None:
    index, count, word = fields
    readings.stages[index].changes.append(f"toy {count}: {word}")


STAGE = StageType(
    name="toy",
    options=(Option("word", text), Option("times", integer, 2)),
    assignments=_assignments,
    template=Path(__file__).with_name("toy.sh"),
    records={"toy": _toy},
)
