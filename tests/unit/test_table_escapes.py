"""What a host says reaches the person's terminal written out, never obeyed: a process
named with an escape sequence or a newline (anyone on the node can name one so)."""

from __future__ import annotations

import io

from rich.console import Console

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult, StageResult
from fleetclean.results import table

NAME = "x\x1b]0;owned\x07\x1b[2J\nrm -rf ~ #"


def terminal() -> Console:
    # As fleetclean makes its console (commands/env.py): no highlighting.
    return Console(file=io.StringIO(), force_terminal=True, no_color=True, highlight=False,
                   width=200)


def test_a_reason_with_control_characters_is_printed_escaped() -> None:
    dirty = HostResult("node01", HostStatus.DIRTY, f"GPU0 1024 MiB; held by 77 {NAME}",
                       gpus=(GpuRow(0, "GPU-0", "NVIDIA H200", 1024, 143771),))
    console = terminal()
    table.print_result(console, RunResult("status", 0.1, (dirty,)))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b]0;" not in out and "\x1b[2J" not in out and "\x07" not in out
    reason = [line for line in out.splitlines() if "held by 77" in line]
    assert len(reason) == 1, out
    assert "77 x\\x1b]0;owned\\x07\\x1b[2J\\nrm -rf ~ #" in reason[0]


def test_a_check_line_with_control_characters_is_printed_escaped() -> None:
    stage = StageResult(name="stop-server", type="signal", status="ok",
                        changes=(f"would signal 77 {NAME}",))
    host = HostResult("node01", HostStatus.CLEAN, stages=(stage,))
    console = terminal()
    table.print_check(console, RunResult("post-extraction", 0.1, (host,)))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b]0;" not in out and "\x1b[2J" not in out
    assert "would signal 77 x\\x1b]0;owned\\x07\\x1b[2J\\nrm -rf ~ #" in out
