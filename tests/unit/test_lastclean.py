"""The hint of which hosts read clean last (results/lastclean.py): what it keeps, what it
forgets, and that a broken file or state directory never fails a run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetclean.models import GpuProcess, GpuRow, HostResult, HostStatus, RunResult
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


def busy(name: str, *pids: int, ended: bool = True, device_only: bool = False,
         status: HostStatus = HostStatus.DIRTY) -> HostResult:
    apps = tuple(GpuProcess(pid, "python", 100, "GPU-1", device_only=device_only,
                            start=pid * 10) for pid in pids)
    return HostResult(name, status, gpus=(ROW,), processes=apps, ended=ended)


def named(*pids: int) -> str:
    """FC_VHINT's words for ``busy``'s processes ``pids``."""
    return " ".join(f"{pid}:{pid * 10}" for pid in pids)


def test_the_processes_a_status_named_are_kept_until_it_names_none() -> None:
    lastclean.update(result(busy("a", 812, 77, 812), busy("b", 5)), now=1000.0)
    assert lastclean.named() == {"a": named(77, 812), "b": named(5)}
    # Clean, cut off before its end, or naming only device-file holders: forgotten.
    lastclean.update(result(clean("a"), busy("b", 5, ended=False)), now=1000.0)
    assert lastclean.named() == {}
    lastclean.update(result(busy("a", 9, device_only=True), busy("b", 1)), now=1000.0)
    assert lastclean.named() == {}
    # A faulty host names its processes as a dirty one does; a host not in the run stays.
    lastclean.update(result(busy("a", *range(100, 200), status=HostStatus.FAULTY)), now=1000.0)
    lastclean.update(result(busy("b", 6)), now=1000.0)
    assert lastclean.named() == {"a": named(*range(100, 100 + lastclean.MAX_NAMED)),
                                 "b": named(6)}
    lastclean.update(result(busy("b", 6)), now=1000.0 + 31 * DAY)
    assert lastclean.named() == {"b": named(6)}


def test_a_process_the_node_could_not_read_is_never_named_for_the_next_status() -> None:
    # No start time: not in the node's PID namespace (a container's, by nvidia-smi's PID),
    # where a process of the same PID would be another.
    apps = (GpuProcess(812, "python", 100, "GPU-1"), GpuProcess(77, "python", 100, "GPU-1",
                                                                 start=70))
    lastclean.update(result(HostResult("a", HostStatus.DIRTY, gpus=(ROW,), processes=apps,
                                       ended=True)), now=1000.0)
    assert lastclean.named() == {"a": "77:70"}


@pytest.mark.parametrize("value", [
    "x", 3, [1e9], [1e9, []], [1e9, [[True, 5]]], [1e9, [["12", 5]]], [1e9, [[1, 5]]],
    [1e9, [[2**22, 5]]], [1e400, [[12, 5]]], [1e9, [[12.0, 5]]], [1e9, [[12]]], [1e9, 12],
    [1e9, [[12, -1]]], [1e9, [[12, 5.0]]], [1e9, [[12, 5, 6]]], [1e9, [12]]])
def test_a_damaged_entry_of_the_processes_named_names_nothing(value: object) -> None:
    path = lastclean.path().with_name(lastclean.NAMED_FILE)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"hosts": {"a": value,
                                          "b": [1e9, [[12, 0], [4194303, 2**62]]]}}))
    assert lastclean.named() == {"b": f"12:0 4194303:{2**62}"}


def test_a_watch_renders_a_hosts_read_anew_when_the_processes_it_named_change() -> None:
    from fleetclean.commands import status
    from fleetclean.commands.parser import build_parser
    from fleetclean.models import Host

    hosts = [Host("a", "a"), Host("b", "b")]
    args = build_parser().parse_args(["status", "--watch", "1", "-i", "a,b,"])
    _, jobs, reads = status._watch_jobs(hosts, args)

    def refresh(*seen: HostResult) -> dict[str, list[str]]:
        """Each host's next script: its PIDs to read early (fc_main's FC_VHINT line)."""
        nonlocal jobs
        jobs = status._next_reads(jobs, result(*seen), reads, args)
        return {j.host.name: re.findall(r"^    FC_VHINT=(.*)$", "".join(j.pieces), re.M)
                for j in jobs}

    assert refresh(busy("a", 812, 77), busy("b", 5)) == {"a": [f"'{named(77, 812)}'"],
                                                         "b": [named(5)]}
    same = reads["a"].q
    assert refresh(busy("a", 77, 812), clean("b")) == {"a": [f"'{named(77, 812)}'"], "b": []}
    assert reads["a"].q is same  # nothing changed: not rendered again
    assert refresh(busy("a", 77, 812, ended=False), busy("b", 6)) == {"a": [], "b": [named(6)]}
