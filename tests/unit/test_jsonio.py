"""The one JSON round trip: what --json prints, run records store and history reads back."""

from __future__ import annotations

import json

import pytest

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult, Signalled, StageResult
from fleetclean.results import jsonio


def result() -> RunResult:
    stage = StageResult("stop-server", "signal", "ok", 3, 3, 0, 0.25)
    gpus = (GpuRow(0, "GPU-a", "NVIDIA H200", 0, 143771), GpuRow(1, "GPU-b", "H200", None, None))
    return RunResult("post-extraction", 1.5, (
        HostResult("gpu01", HostStatus.CLEAN, None, 0.75, (stage,), gpus,
                   signalled=(Signalled(42, "python3 -m sglang.launch_server", "TERM"),)),
        HostResult("gpu02", HostStatus.FAULTY, "GPU lost", 0.5),
        HostResult("gpu03", HostStatus.TIMEOUT, "timed out running the script", 300.0),
    ))


def test_a_result_survives_the_round_trip_through_json_text() -> None:
    text = json.dumps(jsonio.to_json(result()))
    assert jsonio.from_json(json.loads(text)) == result()


def test_faulty_has_its_own_summary_key_and_is_not_failed() -> None:
    assert jsonio.to_json(result())["summary"] == {
        "hosts": 3, "clean": 1, "dirty": 0, "faulty": 1, "failed": 1}


def test_faulty_exits_1_like_dirty() -> None:
    faulty = RunResult("status", 0.1, (HostResult("gpu02", HostStatus.FAULTY, "GPU lost"),))
    assert faulty.exit_status == 1


def test_an_old_summary_without_faulty_is_recomputed_not_trusted() -> None:
    data = jsonio.to_json(result())
    data["summary"] = {"hosts": 3, "clean": 3, "dirty": 0, "failed": 0}
    assert jsonio.summary(jsonio.from_json(data))["clean"] == 1


@pytest.mark.parametrize("damage", [
    {}, {"playbook": "x", "duration_s": 1}, {"playbook": "x", "duration_s": 1, "hosts": [{}]},
    {"playbook": "x", "duration_s": 1, "hosts": [{"host": "a", "status": "sparkly"}]},
    {"playbook": "x", "duration_s": "slow", "hosts": []}, [], "text",
])
def test_damaged_input_is_one_value_error(damage: object) -> None:
    with pytest.raises(ValueError, match="not a fleetclean result"):
        jsonio.from_json(damage)
