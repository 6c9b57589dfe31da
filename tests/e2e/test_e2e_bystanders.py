"""Precision (issue #13): a process that merely mentions the server's name is a bystander.
Over SSH on a simulated node: an engineer's ``tail -f /root/logs/sglang_server.log`` and
``python3 /root/analyze_sglang_results.py`` (real programs, each in a session of its own)
survive ``post-extraction`` and ``free-gpus``, while the server, its workers and its orphans
do not; ``match: cmdline`` in a user playbook brings the old whole-command-line match back;
``--check`` and ``--json`` say which part of each command line matched.

One node serves the module; each test leaves it idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, alive, live

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
LOG = "/root/logs/sglang_server.log"
SCRIPT = "/root/analyze_sglang_results.py"



def bystanders(fleet: SimFleet) -> dict[str, int]:
    """The two processes of the issue, as an engineer starts them."""
    tail = fleet.spawn("node01", "exec", argv=["tail", "-f", LOG],
                       files={LOG: "[2026-12-01 12:00:00] sglang server ready\n"})
    script = fleet.spawn("node01", "exec", argv=["python3", SCRIPT, "--log", LOG],
                         files={SCRIPT: "import time\ntime.sleep(3600)\n"})
    return {"tail": tail[0], "analyze": script[0]}


def crashed_server(fleet: SimFleet) -> list[int]:
    """An SGLang server killed alone (a crash): its schedulers hold their GPUs, its
    detokenizer holds none; all are orphans of PID 1 now, in the dead server's group."""
    pids = fleet.spawn("node01", "sglang", gpus="4-5", mib=1000)
    fleet.run_in("node01", ["kill", "-KILL", str(pids[0])])
    return pids[1:]


def signalled(host: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["pid"]: s for s in host["signalled"]}


@pytest.mark.parametrize("playbook,grace", [("post-extraction", "grace=2"),
                                            ("free-gpus", "sglang_grace=2")])
def test_tail_and_analysis_script_survive_while_server_workers_orphans_go(
        fleet: SimFleet, cli: Cli, playbook: str, grace: str) -> None:
    keep = bystanders(fleet)
    server = fleet.spawn("node01", "sglang", gpus="0-3", mib=1000)
    orphan = fleet.spawn("node01", "orphan", gpu=6, mib=1000)
    crashed = crashed_server(fleet)
    res = cli("run", playbook, "-i", fleet.inventory_path, "--json", "-e", grace)
    host = res.host("node01")
    assert res.code == 0 and host["status"] == "clean", (res.out, res.err)
    assert alive(fleet, "node01", list(keep.values())) == list(keep.values())
    assert not set(keep.values()) & set(signalled(host))
    assert live(fleet, "node01", server + orphan + crashed) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    # The crashed server's detokenizer holds no GPU: it is taken as an orphaned worker.
    detok = max(crashed)
    assert signalled(host)[detok]["identity"] == "sglang::detokenizer"


def test_post_extraction_says_why_it_spared_a_match(fleet: SimFleet, cli: Cli) -> None:
    keep = bystanders(fleet)
    fleet.spawn("node01", "sglang", gpus="0-1", mib=1000)
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json", "-e", "grace=2")
    stages = {s["name"]: s for s in res.host("node01")["stages"]}
    assert res.code == 0 and alive(fleet, "node01", list(keep.values())) == list(keep.values())
    assert stages["kill-workers"]["matched"] == 0


def test_check_and_json_say_which_part_matched(fleet: SimFleet, cli: Cli) -> None:
    bystanders(fleet)
    server = fleet.spawn("node01", "sglang", gpus="0-1", mib=1000)
    check = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert check.code == 1, check.out + check.err
    text = " ".join(check.out.split())
    assert f"to {server[0]} (python3 -m sglang.launch_server" in text
    assert "[module: python3 -m sglang.launch_server]" in text
    assert f"to {server[1]} (sglang::scheduler_TP0) [tree]" in text
    assert "analyze_sglang" not in text and "tail -f" not in text
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json", "-e", "grace=2")
    by_pid = signalled(res.host("node01"))
    assert by_pid[server[0]]["match"] == "module"
    assert by_pid[server[0]]["identity"] == "python3 -m sglang.launch_server"
    assert by_pid[server[1]]["match"] == "tree"


def test_match_cmdline_restores_the_whole_command_line_match(
        fleet: SimFleet, cli: Cli, tmp_path: Path) -> None:
    keep = bystanders(fleet)
    book = tmp_path / "broad.yaml"
    book.write_text(
        "name: broad\n"
        "description: the old kill-workers, whole command lines\n"
        "stages:\n"
        "  - name: kill-workers\n"
        "    type: signal\n"
        "    pattern: sglang\n"
        "    match: cmdline\n"
        "    grace: 1\n")
    res = cli("run", book, "-i", fleet.inventory_path, "--json")
    by_pid = signalled(res.host("node01"))
    assert res.code == 0, res.out + res.err
    assert live(fleet, "node01", list(keep.values())) == [], (keep, by_pid)
    assert by_pid[keep["tail"]]["match"] == "cmdline"
    assert by_pid[keep["analyze"]]["cmdline"].startswith(f"python3 {SCRIPT}")
