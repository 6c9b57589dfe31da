"""Stage types come from the registry: a toy type registered from one test module is
loaded, checked, rendered, run by bash and read back like a built-in one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import toy_stage

from fleetclean.engine import stages
from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import render_script
from fleetclean.engine.stages.base import StageType
from fleetclean.engine.variables import resolve
from fleetclean.errors import PlaybookError, VariableError
from fleetclean.results.parse import _GENERIC, parse_script_output

TOY_BOOK = """name: toy-book
vars: {word: "tab\\there, new\\nline"}
stages:
  - {name: say, type: toy, word: "{{ word }}", times: 3}
  - {name: again, type: toy, word: plain}
"""


@pytest.fixture
def toy() -> Iterator[StageType]:
    stages.register(toy_stage.STAGE)
    try:
        yield toy_stage.STAGE
    finally:
        stages.unregister("toy")


def book(tmp_path: Path, text: str) -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return str(path)


def test_toy_stage_type_renders_runs_and_parses_end_to_end(toy: StageType,
                                                           tmp_path: Path) -> None:
    pb = load_playbook(book(tmp_path, TOY_BOOK))
    assert [s.options["times"] for s in pb.stages] == [3, 2]  # the toy's default
    # Check mode: lib.sh takes no lock on this machine; the toy stage runs either way.
    script = render_script(resolve(pb, {}, {}), check=True, host_name="local")
    assert "fc_stage_toy() {" in script
    out = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True,
                         timeout=60, check=False)
    report = parse_script_output(out.stdout, out.stderr, out.returncode)
    assert report.error is None, (report.error, out.stderr)
    say, again = report.stages
    assert (say.name, say.type, say.status, say.matched) == ("say", "toy", "ok", 3)
    assert say.changes == tuple(f"toy {i}: tab\there, new\nline" for i in (1, 2, 3))
    assert again.changes == ("toy 1: plain", "toy 2: plain")
    assert again.message == "said it 2 times"


def test_toy_options_are_checked_by_the_toy_module(toy: StageType, tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="unknown key 'tims' for type toy"):
        load_playbook(book(tmp_path, "name: t\nstages:\n  - {type: toy, word: a, tims: 1}\n"))
    with pytest.raises(PlaybookError, match="missing required key 'word'"):
        load_playbook(book(tmp_path, "name: t\nstages:\n  - {type: toy}\n"))
    pb = load_playbook(book(tmp_path, "name: t\nstages:\n  - {type: toy, word: a, times: x}\n"))
    with pytest.raises(VariableError, match="stage 'toy-1': times must be a non-negative "
                                            "integer, not 'x'"):
        resolve(pb, {}, {})


def test_an_unregistered_type_is_unknown_to_the_loader(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="unknown stage type 'toy'"):
        load_playbook(book(tmp_path, TOY_BOOK))


def test_a_stage_type_cannot_take_a_name_or_record_kind_already_in_use(
        toy: StageType) -> None:
    with pytest.raises(ValueError, match="already registered"):
        stages.register(toy)
    for kind in ("verify", "end"):
        clash = StageType(name="toy2", options=(), assignments=lambda s: [],
                          template=toy.template, records={kind: lambda r, a: None})
        with pytest.raises(ValueError, match="are taken"):
            stages.register(clash)


def test_the_parser_reads_exactly_the_generic_record_kinds() -> None:
    assert tuple(_GENERIC) == stages.GENERIC_RECORDS
