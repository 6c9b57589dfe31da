"""Output for logs and pipes: nothing hard-wrapped off a terminal, COLUMNS honoured,
NO_COLOR / --no-color honoured, counted nouns right."""

from __future__ import annotations

import argparse
import io

import pytest

from fleetclean.cli import Env, main
from fleetclean.commands import info
from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult, Signalled
from fleetclean.results import table


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


LONG = "gpu-" + "x" * 150 + ".lab"


def fleet(n: int = 2, *, signals: int = 2) -> RunResult:
    gpus = tuple(GpuRow(i, f"GPU-{i}", "NVIDIA H200", 0, 143771) for i in range(8))
    sent = tuple(Signalled(100 + i, "python3 -m sglang.launch_server", "TERM")
                 for i in range(signals))
    hosts = [HostResult(LONG, HostStatus.CLEAN, None, 0.5, gpus=gpus, signalled=sent)]
    hosts += [HostResult(f"gpu{i:02d}", HostStatus.UNREACHABLE, "cannot connect: " + "y" * 200)
              for i in range(1, n)]
    return RunResult("post-extraction", 1.0, tuple(hosts))


def printed(environ: dict[str, str], result: RunResult) -> str:
    out = io.StringIO()
    table.print_result(Env(stdout=out, environ=environ).console(), result)
    return out.getvalue()


def test_off_a_terminal_the_table_and_problem_lines_are_never_wrapped() -> None:
    text = printed({}, fleet())
    row = [line for line in text.splitlines() if LONG in line]
    assert len(row) == 1 and row[0].rstrip().endswith("clean")
    assert any(line.startswith("gpu01: unreachable: cannot connect: " + "y" * 200)
               for line in text.splitlines())


def test_columns_is_honoured_for_the_table_but_text_lines_stay_whole() -> None:
    result = fleet()
    wide = printed({}, result).splitlines()
    narrow = printed({"COLUMNS": "60"}, result).splitlines()
    assert max(len(line) for line in wide[1:4]) > 60  # the table's own width
    assert max(len(line) for line in narrow[1:4]) <= 60  # header, rule, row fit COLUMNS
    assert "gpu01: unreachable: cannot connect: " + "y" * 200 in narrow


@pytest.mark.parametrize("environ,no_color,coloured", [
    ({}, False, True), ({"NO_COLOR": "1"}, False, False), ({}, True, False),
    ({"NO_COLOR": ""}, False, True),  # no-color.org: set *and not empty*
])
def test_no_color_and_the_no_color_flag(environ: dict[str, str], no_color: bool,
                                        coloured: bool) -> None:
    out = Tty()
    table.print_result(Env(stdout=out, environ=environ, no_color=no_color).console(), fleet())
    assert ("\x1b[32m" in out.getvalue()) is coloured  # green "clean"


def test_the_no_color_option_reaches_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def spy(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
        seen.append(env.no_color)
        return 0

    monkeypatch.setattr(info, "cmd_playbooks", spy)
    for argv in (["--no-color", "playbooks"], ["playbooks", "--no-color"], ["playbooks"]):
        main(argv, Env(stdout=io.StringIO(), stderr=io.StringIO(), environ={}))
    assert seen == [True, True, False]


@pytest.mark.parametrize("hosts,signals,expected", [
    (1, 1, "1 host: 1 clean, 0 dirty, 0 failed in 1.00s; 1 signal sent"),
    (2, 3, "2 hosts: 1 clean, 0 dirty, 1 failed in 1.00s; 3 signals sent"),
])
def test_counted_nouns_in_the_summary_line(hosts: int, signals: int, expected: str) -> None:
    assert table.summary_line(fleet(hosts, signals=signals)) == expected


def test_faulty_hosts_are_counted_and_listed_only_when_present() -> None:
    faulty = HostResult("gpu09", HostStatus.FAULTY, "GPU3 lost (Xid 79)")
    result = RunResult("status", 1.0, (faulty,))
    assert table.summary_line(result) == "1 host: 0 clean, 0 dirty, 1 faulty, 0 failed in 1.00s"
    assert table.problems(result) == ["gpu09: faulty: GPU3 lost (Xid 79)"]
    assert "faulty" in printed({}, result)


@pytest.mark.parametrize(("environ", "tty", "expected"), [
    ({}, True, True),
    ({}, False, False),
    ({"TTY_COMPATIBLE": "0"}, True, False),
    ({"TTY_COMPATIBLE": "1"}, False, True),
    ({"FORCE_COLOR": "1"}, False, True),
    ({"FORCE_COLOR": ""}, True, False),
    ({"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, True, False),
])
def test_a_live_view_is_chosen_as_rich_would_draw_one(
    environ: dict[str, str], tty: bool, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)  # rich reads the process's environment
    stream = Tty() if tty else io.StringIO()
    env = Env(stderr=stream, environ=environ)
    assert env.may_be_terminal(stderr=True) is expected
    assert env.console(stderr=True).is_terminal is expected
