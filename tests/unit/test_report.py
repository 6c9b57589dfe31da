"""The fleet table, JSON and CSV, from results built by hand (no SSH needed)."""

import csv
import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from fleetclean.models import (
    GpuProcess,
    GpuRow,
    HostResult,
    HostStatus,
    RunResult,
    Signalled,
    StageResult,
)
from fleetclean.results import csvout, jsonio, table

GOLDEN = Path(__file__).parent.parent / "data" / "golden"
TOTAL = 143771


def gpus(used: list[int | None]) -> tuple[GpuRow, ...]:
    return tuple(
        GpuRow(i, f"GPU-{i:08x}-0000", "NVIDIA H200", u, TOTAL) for i, u in enumerate(used)
    )


def clean(name: str) -> HostResult:
    stage = StageResult("stop-server", "signal", "ok", matched=10, signalled=10, duration_s=0.2)
    return HostResult(name, HostStatus.CLEAN, None, 0.4, (stage,), gpus([0] * 8),
                      signalled=(Signalled(4242, "python3 -m sglang.launch_server", "TERM",
                                           match="module",
                                           identity="python3 -m sglang.launch_server"),))


def folded_fleet() -> RunResult:
    return RunResult("post-extraction", 1.23, tuple(clean(f"gpu{i:02d}") for i in range(1, 15)))


def mixed_fleet() -> RunResult:
    dirty = HostResult(
        "gpu03", HostStatus.DIRTY, "still used: GPU2 40960 MiB; held by 77 python3", 30.1,
        gpus=gpus([0, 0, 40960, 0, 0, 0, 0, 0]),
        processes=(GpuProcess(77, "python3", 40960, "GPU-00000002-0000"),),
    )
    na = HostResult("gpu04", HostStatus.ERROR, "nvidia-smi: Failed to initialize NVML: "
                    "Driver/library version mismatch (exit 18)", 0.3)
    down = [HostResult(f"gpu0{i}", HostStatus.UNREACHABLE,
                       "cannot connect: connection refused", 0.01)
            for i in (5, 6)]
    key = HostResult("gpu07", HostStatus.HOST_KEY_MISMATCH, "host key CHANGED", 0.02)
    return RunResult("post-extraction", 30.5,
                     (clean("gpu01"), clean("gpu02"), dirty, na, *down, key, clean("gpu08")))


def render(result: RunResult) -> str:
    console = Console(width=120, no_color=True, record=True, file=io.StringIO())
    table.print_result(console, result)
    return console.export_text()


@pytest.mark.parametrize("name,result", [("table_folded", folded_fleet()),
                                         ("table_mixed", mixed_fleet())])
def test_table_matches_golden(name: str, result: RunResult) -> None:
    text = render(result)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("FLEETCLEAN_REGEN_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_identical_clean_hosts_fold_into_one_node_set() -> None:
    text = render(folded_fleet())
    assert "gpu[01-14]" in text
    assert "14 hosts: 14 clean, 0 dirty, 0 failed" in text


def test_failed_hosts_with_the_same_reason_are_listed_once() -> None:
    lines = table.problems(mixed_fleet())
    assert "gpu[05-06]: unreachable: cannot connect: connection refused" in lines
    assert not any("gpu01" in line for line in lines)


def test_json_follows_the_contract() -> None:
    data = jsonio.to_json(mixed_fleet())
    assert set(data) == {"playbook", "duration_s", "summary", "hosts"}
    assert data["summary"] == {"hosts": 8, "clean": 3, "dirty": 1, "faulty": 0,
                               "failed": 4}
    host = data["hosts"][0]
    assert set(host) == {"host", "status", "error", "duration_s", "stages", "gpus", "signalled",
                         "verify", "left_running", "stuck", "resets", "refused", "warnings"}
    assert set(host["stages"][0]) == {"name", "type", "status", "matched", "signalled",
                                      "remaining", "duration_s"}
    assert set(host["gpus"][0]) == {"index", "uuid", "name", "memory_used_mib",
                                    "memory_total_mib", "processes"}
    # owner: null where the script named none (a record from before owners)
    assert host["signalled"] == [{"pid": 4242, "cmdline": "python3 -m sglang.launch_server",
                                  "signal": "TERM", "match": "module",
                                  "identity": "python3 -m sglang.launch_server",
                                  "owner": None}]
    json.dumps(data)


def test_csv_has_one_row_per_host_and_gpu() -> None:
    out = io.StringIO()
    csvout.write_csv(mixed_fleet(), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 4 * 8 + 4  # 4 hosts with GPUs, 4 failed hosts with one row each
    dirty = [r for r in rows if r["host"] == "gpu03" and r["index"] == "2"]
    assert dirty[0]["memory_used_mib"] == "40960"


def test_exit_status_reflects_the_worst_host() -> None:
    assert folded_fleet().exit_status == 0
    assert mixed_fleet().exit_status == 2


def test_check_listing_is_shown_once_for_hosts_that_gave_the_same_one() -> None:
    would = StageResult("stop-server", "signal", "changed", matched=1,
                        changes=("would send TERM to 5 (python3 -m sglang.launch_server)",))
    hosts = tuple(HostResult(f"gpu0{i}", HostStatus.DIRTY, stages=(would,)) for i in (1, 2, 3))
    other = HostResult("gpu04", HostStatus.CLEAN, stages=(StageResult("stop-server", "signal",
                                                                      "ok"),))
    blocks = table.check_blocks(RunResult("post-extraction", 0.1, (*hosts, other)))
    assert blocks == [("gpu[01-03]",
                       ["stop-server: would send TERM to 5 (python3 -m sglang.launch_server)"])]
