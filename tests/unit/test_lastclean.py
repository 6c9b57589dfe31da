"""The hint of which hosts read clean last (results/lastclean.py): what it keeps, what it
forgets, and that a broken file or state directory never fails a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results import lastclean

ROW = GpuRow(0, "GPU-1", "NVIDIA H200", 0, 143771)
DAY = 24 * 3600.0


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def result(*hosts: HostResult) -> RunResult:
    return RunResult("status", 1.0, hosts)


def clean(name: str) -> HostResult:
    return HostResult(name, HostStatus.CLEAN, gpus=(ROW,))


def test_clean_hosts_are_kept_and_forgotten_once_seen_otherwise() -> None:
    lastclean.update(result(clean("a"), clean("b")), now=1000.0)
    assert lastclean.load() == {"a", "b"}
    for status in (HostStatus.DIRTY, HostStatus.FAULTY, HostStatus.UNREACHABLE,
                   HostStatus.TIMEOUT, HostStatus.ERROR):
        lastclean.update(result(clean("a"), HostResult("b", status, gpus=(ROW,))), now=1000.0)
        assert lastclean.load() == {"a"}, status
        lastclean.update(result(clean("b")), now=1000.0)
    # A run of other hosts leaves these as they were.
    lastclean.update(result(HostResult("c", HostStatus.DIRTY, gpus=(ROW,))), now=1000.0)
    assert lastclean.load() == {"a", "b"}


def test_a_host_judged_on_some_gpus_only_or_with_no_gpu_is_not_taken_for_clean() -> None:
    partial = HostResult("a", HostStatus.CLEAN, gpus=(ROW,), judged_gpus=(1,))
    lastclean.update(result(partial, HostResult("b", HostStatus.CLEAN)), now=1000.0)
    assert lastclean.load() == set()


def test_hosts_not_seen_clean_for_thirty_days_are_dropped() -> None:
    lastclean.update(result(clean("old")), now=1000.0)
    lastclean.update(result(clean("new")), now=1000.0 + 29 * DAY)
    assert lastclean.load() == {"old", "new"}
    lastclean.update(result(clean("new")), now=1000.0 + 31 * DAY)
    assert lastclean.load() == {"new"}


def test_a_status_run_again_within_the_hour_leaves_the_file_as_it_is(state: Path) -> None:
    lastclean.update(result(clean("a")), now=1000.0)
    written = lastclean.path().stat().st_mtime_ns
    lastclean.update(result(clean("a")), now=1000.0 + 1800)
    assert lastclean.path().stat().st_mtime_ns == written
    assert json.loads(lastclean.path().read_text())["hosts"] == {"a": 1000.0}


@pytest.mark.parametrize("text", ["", "{", "[]", '{"hosts": 3}', '{"hosts": {"a": "x"}}',
                                  '{"hosts": {"a": 1e400}}', "[" * 200_000])
def test_an_unreadable_file_is_no_host_known_clean_and_is_written_anew(text: str) -> None:
    lastclean.path().parent.mkdir(parents=True)
    lastclean.path().write_text(text)
    assert lastclean.load() == set()
    lastclean.update(result(clean("a")), now=1000.0)
    assert lastclean.load() == {"a"}


def test_a_state_directory_that_cannot_be_written_costs_the_hint_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(blocker / "state"))
    lastclean.update(result(clean("a")), now=1000.0)  # no exception
    assert lastclean.load() == set()
