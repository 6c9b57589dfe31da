"""What a run's start reads of the past runs (``lastseen``): each finished record leaves a
small summary beside it, and the answer is the same from it as from the record."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from fleetclean.commands.output import judging
from fleetclean.fleet import Event
from fleetclean.models import GpuRow, Host, HostResult, HostStatus, RunResult
from fleetclean.results import lastseen
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


def test_the_records_are_read_once_whichever_threads_judge(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    finish_run(["gpu01"], {"gpu01": 8})
    reads: list[int] = []
    real = lastseen.last_seen

    def counted(names: Iterable[str]) -> dict[str, lastseen.Seen]:
        reads.append(1)
        time.sleep(0.05)  # long enough for every thread to ask meanwhile
        return real(names)

    monkeypatch.setattr(lastseen, "last_seen", counted)
    judged = lastseen.HistoryJudge([Host("gpu01", "10.0.0.1")])
    # gpu01 showed 8 GPUs last time: 7 now is faulty, whoever asks.
    seven = HostResult("gpu01", HostStatus.CLEAN, gpus=gpus(7))
    with ThreadPoolExecutor(16) as pool:
        verdicts = list(pool.map(lambda _: judged(seven).status, range(32)))
    assert reads == [1] and set(verdicts) == {HostStatus.FAULTY}


def test_the_live_view_is_fed_each_host_judged_or_else_as_reported() -> None:
    fed: list[Event] = []

    def faulty(h: HostResult) -> HostResult:
        return replace(h, status=HostStatus.FAULTY)

    def broken(h: HostResult) -> HostResult:
        raise OSError("records unreadable")

    done = Event("gpu01", "done", result=HostResult("gpu01", HostStatus.CLEAN))
    judging(fed.append, faulty)(Event("gpu01", "start"))
    judging(fed.append, faulty)(done)
    judging(fed.append, broken)(done)
    assert [(e.kind, e.result and e.result.status) for e in fed] == [
        ("start", None), ("done", HostStatus.FAULTY), ("done", HostStatus.CLEAN)]
