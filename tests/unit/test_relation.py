"""``scope: related``'s rule (``lib-match.sh``'s ``fc_related``) on a process table written
by hand: one bash process, no simulator, no /proc read. PID 100 is the server an earlier
stage stopped (it led its process group; its session is a login's, which it did not lead).
"""

from __future__ import annotations

import subprocess

import pytest

from fleetclean.engine.stages import template

# pid: (ppid, pgrp, sid, identity part, command line)
TABLE = {
    100: (1, 100, 90, "module", "python3 -m sglang.launch_server --tp 8"),
    101: (100, 100, 90, "title", "sglang::scheduler_TP0"),
    102: (1, 100, 90, "title", "sglang::detokenizer"),
    103: (101, 103, 103, "code", "python3 -c from multiprocessing.spawn import spawn_main"),
    110: (90, 110, 90, "script", "python3 /root/analyze_sglang_results.py"),
    200: (1, 200, 200, "script", "python3 /root/analyze_sglang_results.py --log x"),
    300: (1, 299, 299, "title", "sglang::scheduler_TP3"),
    301: (1, 299, 299, "script", "python3 /root/sglang_eval.py"),
    302: (1, 299, 299, "code", "python3 -c from multiprocessing.spawn import spawn_main"
                                " --multiprocessing-fork"),
    400: (1, 400, 400, "script", "python3 /opt/train/sglang_finetune.py"),
    401: (1, 401, 401, "script", "python3 /opt/monitor/sglang_exporter.py"),
    500: (1, 500, 500, "title", "sglang::router"),
    90: (1, 90, 90, "executable", "-bash"),
}
EXPECTED = {
    101: "in the tree of pid 101",  # a descendant of the server (itself, at signal time)
    102: "in the process group of pid 100",
    103: "in the tree of pid 101",  # left the group, still a descendant
    110: None,  # same login session as the server, which did not lead it
    200: None,  # a person's script, leading its own group
    300: "orphaned worker",  # a crashed server's scheduler: group leader gone
    301: None,  # same dead group, but not a worker (a script)
    302: "orphaned worker",  # a multiprocessing child
    400: "holds a GPU",
    401: None,  # an NVML user: device files open, no CUDA
    500: None,  # a titled process leading its own group: a daemon someone started
}


@pytest.fixture(scope="module")
def verdicts() -> dict[int, str | None]:
    lines = [template("lib.sh"), template("lib-match.sh")]
    for pid, (ppid, pgrp, sid, part, cmd) in TABLE.items():
        lines.append(f"FC_PPID[{pid}]={ppid} FC_PGRP[{pid}]={pgrp} FC_SID[{pid}]={sid} "
                     f"FC_START[{pid}]={pid}0 FC_IDPART[{pid}]={part} FC_CMD[{pid}]='{cmd}'")
    lines += [
        'declare -gA FC_GF=([0]=" 400 401") FC_GF_CUDA=([400]=1)',
        "fc_note_related 100 101",  # what the earlier stage signalled: the server, a worker
        f"for p in {' '.join(map(str, EXPECTED))}; do",
        '    if fc_related "$p"; then printf "%s\\t%s\\n" "$p" "${FC_RELWHY[$p]}";',
        '    else printf "%s\\t-\\n" "$p"; fi',
        "done",
    ]
    out = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True,
                         check=True).stdout
    got: dict[int, str | None] = {}
    for line in out.splitlines():
        pid, why = line.split("\t")
        got[int(pid)] = None if why == "-" else why
    return got


@pytest.mark.parametrize("pid", sorted(EXPECTED))
def test_related_rule(verdicts: dict[int, str | None], pid: int) -> None:
    want = EXPECTED[pid]
    got = verdicts[pid]
    if want is None:
        assert got is None, TABLE[pid]
    else:
        assert got is not None and got.startswith(want), (TABLE[pid], got)
