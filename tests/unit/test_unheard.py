"""Which tokens of unheard teardowns a host's next run asks for (results/unheard.py): never
one whose run is still in flight, always one whose run is over, and a damaged file is no
reason to fail a run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results import unheard


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path))
    return tmp_path / unheard.FILE


def write(path: Path, hosts: dict[str, object]) -> None:
    path.write_text(json.dumps({"hosts": hosts}))


def gone_pid() -> int:
    """The PID of a process of this test's that has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_token_is_asked_for_once_the_run_that_noted_it_is_gone(notes: Path) -> None:
    now = time.time()
    here = socket.gethostname()
    write(notes, {"gpu01": [["a1", now, gone_pid(), here]],      # its controller died
                  "gpu02": [["b1", now, 1, here]],               # PID 1: in flight
                  "gpu03": [["c1", now, 1, "elsewhere"]],        # another machine's, young
                  "gpu04": [["d1", now - 2 * unheard.FLIGHT_S, 1, "elsewhere"]],
                  "gpu05": [["e1", now], ["e2", now]],           # settled, not heard
                  "gpu06": [["f1", now - 2 * unheard.FLIGHT_S, 1, here]],  # PID 1 now another
                  "gpu07": [["g1", now, os.getpid(), here]]})    # a PID used again: ours
    assert unheard.load() == {"gpu01": "a1", "gpu04": "d1", "gpu05": "e1 e2", "gpu06": "f1",
                              "gpu07": "g1"}


def test_a_run_keeps_its_token_only_where_its_script_started_and_was_not_heard_to_the_end(
    notes: Path,
) -> None:
    unheard.begin(["gpu01", "gpu02", "gpu03"], "r1")
    unheard.settle(RunResult("post-extraction", 1.0, (
        HostResult("gpu01", HostStatus.ERROR, "a stage failed", started=True, ended=True),
        HostResult("gpu02", HostStatus.ERROR, "connection lost", started=True),
        HostResult("gpu03", HostStatus.ERROR, "not started"))), "r1")
    assert unheard.load() == {"gpu02": "r1"}
    # Asked, answered: forgotten. A status settles only what the nodes answered for.
    unheard.settle(RunResult("status", 1.0, (
        HostResult("gpu02", HostStatus.CLEAN, started=True, ended=True, answered=("r1",)),)))
    assert unheard.load() == {}
    assert json.loads(notes.read_text()) == {"hosts": {}}


def test_an_interrupted_run_keeps_the_token_of_every_host_not_heard_to_the_end(
    notes: Path,
) -> None:
    # A Ctrl-C after the hosts' loop calls every host not started: the scripts ran.
    unheard.begin(["gpu01", "gpu02"], "r1")
    unheard.settle(RunResult("post-extraction", 1.0, (
        HostResult("gpu01", HostStatus.ERROR, "not started"),
        HostResult("gpu02", HostStatus.CLEAN, started=True, ended=True)), interrupted=True),
        "r1")
    assert unheard.load() == {"gpu01": "r1"}


def test_a_damaged_file_reads_as_no_tokens(notes: Path) -> None:
    write(notes, {"gpu01": [["a1", "inf"], ["a2", 10**400]],
                  "gpu02": [["b b", time.time()], ["b1", time.time(), -1, socket.gethostname()],
                            ["b2", time.time(), 10**30, socket.gethostname()]],
                  "gpu03": "x", "gpu04": [None, [1], ["c1"]]})
    assert unheard.load() == {"gpu02": "b1 b2"}  # no group, no absurd PID: settled ones
    notes.write_text("[" * 100_000)
    assert unheard.load() == {}


def test_a_watch_asks_at_each_refresh_for_the_tokens_still_unheard(notes: Path) -> None:
    """A watch asks a host for a token until its node answers for it, and from the next
    refresh on for a teardown's left unheard meanwhile (from another terminal), whichever
    GPU read the host's script starts with."""
    import re

    from fleetclean.commands import status
    from fleetclean.commands.parser import build_parser
    from fleetclean.models import GpuProcess, GpuRow, Host

    def asked(jobs: list[object]) -> dict[str, list[str]]:
        return {j.host.name: re.findall(r"^    FC_UNHEARD=(.*)$", "".join(j.pieces), re.M)
                for j in jobs}  # type: ignore[attr-defined]

    row = GpuRow(0, "GPU-1", "NVIDIA H200", 0, 143771)
    busy = GpuRow(0, "GPU-1", "NVIDIA H200", 4000, 143771)
    app = (GpuProcess(77, "python", 4000, "GPU-1", start=770),)
    args = build_parser().parse_args(["status", "--watch", "1", "-i", "a,b,c,"])
    here = socket.gethostname()
    write(notes, {"b": [["t1", time.time(), gone_pid(), here]]})
    # b was in use at the last status, naming the process it names again below: only its
    # tokens change.
    from fleetclean.results import lastclean
    lastclean.update(RunResult("status", 1.0, (HostResult(
        "b", HostStatus.DIRTY, gpus=(busy,), processes=app, ended=True),)))
    _, jobs, reads = status._watch_jobs([Host("a", "a"), Host("b", "b"), Host("c", "c")], args)
    assert asked(jobs) == {"a": [], "b": ["t1"], "c": []}
    # b (in use: its -q read) answered for t1; a teardown of a's went unheard meanwhile.
    result = RunResult("status", 1.0, (
        HostResult("a", HostStatus.CLEAN, gpus=(row,), ended=True),
        HostResult("b", HostStatus.DIRTY, gpus=(busy,), processes=app, ended=True,
                   answered=("t1",)),
        HostResult("c", HostStatus.CLEAN, gpus=(row,), ended=True)))
    unheard.settle(result)
    unheard.begin(["a"], "t2", now=time.time() - 2 * 3600)  # its run over: no longer in flight
    before = reads["c"]
    jobs = status._next_reads(jobs, result, reads, args)
    assert asked(jobs) == {"a": ["t2"], "b": [], "c": []}
    assert "FC_VGFD" in "".join(jobs[0].pieces) and "FC_VQFD" in "".join(jobs[1].pieces)
    assert reads["c"].q is before.q and reads["c"].gpu is before.gpu  # nothing changed
