"""The final table at 1,000 hosts: one line per status first, then only the hosts that are
not clean; ``--all`` lists every row. Results built by hand (no SSH)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from fleetclean.cli import build_parser
from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results import table

TOTAL = 143771
DIRTY = {17, 250, 251, 252, 600, 999}
DOWN = {3, 400}
FAULTY = {777}


def gpus(used: list[int]) -> tuple[GpuRow, ...]:
    return tuple(GpuRow(i, f"GPU-{i}", "NVIDIA H200", u, TOTAL) for i, u in enumerate(used))


def host(i: int) -> HostResult:
    name = f"node{i:04d}"
    if i in DIRTY:
        return HostResult(name, HostStatus.DIRTY, "GPU2 40960 MiB; held by 77 python3",
                          gpus=gpus([0, 0, 40960, 0, 0, 0, 0, 0]))
    if i in DOWN:
        return HostResult(name, HostStatus.UNREACHABLE, "cannot connect: connection refused")
    if i in FAULTY:
        return HostResult(name, HostStatus.FAULTY, "GPU5 lost", gpus=gpus([0] * 7))
    return HostResult(name, HostStatus.CLEAN, gpus=gpus([0] * 8))


def fleet(n: int = 1000) -> RunResult:
    return RunResult("post-extraction", 42.0, tuple(host(i) for i in range(1, n + 1)))


def render(result: RunResult, console: Console | None = None, *, full: bool = False) -> str:
    console = console or Console(width=120, no_color=True, record=True, file=io.StringIO())
    table.print_result(console, result, full=full)
    return console.export_text()


def rows_naming(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(rf"\b{name}\b", line)]


def test_1000_hosts_lead_with_one_line_per_status() -> None:
    lines = render(fleet()).splitlines()
    assert lines[1].split()[:3] == ["clean", "991", "hosts:"]
    assert lines[1].split()[3].startswith("node[0001-0002,0004-0016,0018-0249,0253-")
    assert lines[2].split() == ["dirty", "6", "hosts:", "node[0017,0250-0252,0600,0999]"]
    assert lines[3].split() == ["faulty", "1", "host:", "node0777"]
    assert lines[4].split() == ["unreachable", "2", "hosts:", "node[0003,0400]"]


def test_1000_hosts_list_in_full_only_the_hosts_that_are_not_clean() -> None:
    text = render(fleet())
    for i in DIRTY | FAULTY:
        assert rows_naming(text, f"node{i:04d}"), f"node{i:04d} missing"
    assert not rows_naming(text, "node0001")  # clean hosts only inside the node set
    assert "(991 clean hosts and 2 failed hosts with no GPU read not listed: --all lists " \
        "every host)" in text
    assert "1000 hosts: 991 clean, 6 dirty, 1 faulty, 2 failed" in text
    # Title, 4 status lines, table head (2) + 7 rows, the note, 3 problem lines, summary.
    assert len(text.splitlines()) == 1 + 4 + 2 + 7 + 1 + 3 + 1


def test_hosts_that_failed_before_a_gpu_was_read_are_their_status_and_problem_lines() -> None:
    # A quarter of 1,000 hosts down: a row of dashes a host would say nothing that the
    # status line and the problem line do not (issue #18: not 1,000 lines).
    result = RunResult("status", 9.0, tuple(
        HostResult(f"node{i:04d}", HostStatus.UNREACHABLE, "cannot connect: connection refused")
        if i % 4 == 0 else host(i) if i in DIRTY - {600} else HostResult(
            f"node{i:04d}", HostStatus.CLEAN, gpus=gpus([0] * 8)) for i in range(1, 1001)))
    text = render(result)
    assert "unreachable  250 hosts:" in text
    assert text.count(": unreachable: cannot connect: connection refused") == 1
    assert not re.findall(r"^ node\d{4} .*unreachable *$", text, re.M)
    assert rows_naming(text, "node0017")  # a dirty host is still a row
    assert "(746 clean hosts and 250 failed hosts with no GPU read not listed: --all lists " \
        "every host)" in " ".join(text.split())
    assert len(text.splitlines()) < 100  # node sets wrap; a row a host was 250 and more
    # --all: every host, each unreachable one a row of its own.
    full = render(result, full=True)
    assert all(rows_naming(full, f"node{i:04d}") for i in range(4, 1001, 4))


def test_the_note_names_only_what_it_leaves_out() -> None:
    text = render(RunResult("status", 1.0, tuple(
        HostResult(f"node{i:04d}", HostStatus.TIMEOUT, "ssh banner did not come within 10s")
        for i in range(1, 61))))
    assert "(60 failed hosts with no GPU read not listed: --all lists every host)" in text


def test_all_lists_every_row_folding_identical_clean_ones_as_before() -> None:
    text = render(fleet(), full=True)
    assert not any(line.startswith("clean ") for line in text.splitlines())
    table_rows = [line for line in text.splitlines() if line.rstrip().endswith(
        ("clean", "dirty", "faulty", "unreachable"))]
    # 991 clean hosts with identical rows fold into one row; every other host has its own.
    assert len(table_rows) == 1 + len(DIRTY | DOWN | FAULTY)
    assert "not listed" not in text


def test_a_screenful_is_the_terminal_height_when_there_is_one() -> None:
    def term() -> Console:
        return Console(width=120, height=30, force_terminal=True, no_color=True, record=True,
                       file=io.StringIO())

    assert "(" not in render(fleet(30), term()).splitlines()[1]  # 30 hosts: the table itself
    assert "not listed" not in render(fleet(30), term())
    assert "not listed" in render(fleet(31), term())
    # Not a terminal: about 40 hosts.
    assert "not listed" not in render(fleet(40))
    assert "not listed" in render(fleet(41))


def test_a_thousand_clean_hosts_are_one_line() -> None:
    result = RunResult("status", 3.0, tuple(
        HostResult(f"node{i:04d}", HostStatus.CLEAN, gpus=gpus([0] * 8))
        for i in range(1, 1001)))
    lines = render(result).splitlines()
    assert lines[1].split() == ["clean", "1000", "hosts:", "node[0001-1000]"]
    assert len(lines) == 4  # title, that line, the note, the summary


def test_all_is_an_option_of_run_and_status() -> None:
    parser = build_parser(with_sim=False)
    assert parser.parse_args(["status", "-i", "x,", "--all"]).all
    assert parser.parse_args(["run", "post-extraction", "-i", "x,", "--all"]).all
    assert not parser.parse_args(["status", "-i", "x,"]).all
