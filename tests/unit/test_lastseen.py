"""What a run's start reads of the past runs (``lastseen``): each finished record leaves a
small summary beside it, and the answer is the same from it as from the record."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results.lastseen import last_seen
from fleetclean.results.records import RunRecord, seen_path


def gpus(n: int) -> tuple[GpuRow, ...]:
    return tuple(GpuRow(i, f"GPU-{i}", "NVIDIA H200", 0, 143771) for i in range(n))


def finish_run(names: list[str], counts: dict[str, int], duration: float = 2.0) -> Path:
    record = RunRecord.start(playbook="status", hosts=names, argv=["status"],
                             inventory="lab.yml", variables={}, check=True)
    hosts = tuple(
        HostResult(name, HostStatus.CLEAN if counts.get(name) else HostStatus.UNREACHABLE,
                   duration_s=duration, gpus=gpus(counts.get(name, 0)))
        for name in names)
    return record.finish(RunResult("status", duration, hosts))


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path))
    return tmp_path


def test_the_summary_answers_as_the_record_does(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"gpu{i:04d}" for i in range(1000)]
    # An older run saw 8 GPUs on gpu0001; the newest only 7 there, and never reached gpu0002.
    # (Two controllers: a record is named by its second and its controller's PID.)
    with monkeypatch.context() as m:
        m.setattr(os, "getpid", lambda: 1)
        finish_run(names, {n: 8 for n in names})
    newest = finish_run(names, {**{n: 8 for n in names}, "gpu0001": 7, "gpu0002": 0})
    summary = seen_path(newest)
    assert summary.is_file() and summary.stat().st_size * 20 < newest.stat().st_size
    from_summaries = last_seen(names)
    for record in newest.parent.glob("*.json"):
        seen_path(record).unlink()  # records from before the summaries existed
    assert last_seen(names) == from_summaries
    assert from_summaries["gpu0001"].gpus == 8  # the most a recent run showed
    assert from_summaries["gpu0002"].gpus == 8  # last seen by the older run
    assert len(from_summaries) == 1000


def test_a_run_start_reads_the_summary_not_the_record() -> None:
    record = finish_run(["gpu01"], {"gpu01": 8})
    seen = last_seen(["gpu01"])
    record.write_text("not json: the record is not read when its summary is there")
    assert last_seen(["gpu01"]) == seen and seen["gpu01"].gpus == 8


def test_an_unfinished_run_leaves_no_summary_and_says_nothing(state: Path) -> None:
    RunRecord.start(playbook="status", hosts=["gpu01"], argv=["status"], inventory=None,
                    variables={}, check=True)
    assert [p.suffix for p in (state / "runs").glob("*")] == [".json"]
    assert last_seen(["gpu01"]) == {}
