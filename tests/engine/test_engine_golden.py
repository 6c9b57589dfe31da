"""Golden files of the rendered built-in scripts, and shellcheck on templates and scripts.

A golden script keeps the script's own part (the header, the stage assignments and
``fc_main``); the packaged bash it carries (``lib.sh`` and each stage type's template) is
replaced by one marker line per file, and every packaged ``.sh`` is pinned once, by its
SHA-256 in ``templates.sha256`` (their diffs are reviewed in git, where they live). An edit to
``lib.sh`` then changes one line of the snapshots, not every script.
Regenerate all of them after an intended change, then review the diff:

    FLEETCLEAN_REGEN_GOLDEN=1 .venv/bin/pytest tests/engine -k golden
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from simhelp import RENDERED, shellcheck_each, shellcheck_path

from fleetclean.engine import lazy
from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import carried, render_script
from fleetclean.engine.stages import template
from fleetclean.engine.variables import resolve

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
STAGES = ROOT / "fleetclean" / "engine" / "stages"
REGEN = os.environ.get("FLEETCLEAN_REGEN_GOLDEN") == "1"

def marker(name: str) -> str:
    return f"# [{name}: packaged bash, pinned by tests/data/golden/templates.sha256]\n"

CASES = {
    "post-extraction": ({}, False),
    "post-extraction-check": ({"model_file": "/opt/sglang/models/deepseek_v2.py",
                               "guard_path": "/dev/shm/sglang_hs", "protect": "jupyter"}, True),
    "pre-restart": ({}, False),
    "free-gpus": ({"reset_leaked": "true"}, False),
    "status": ({}, False),
    # A host whose GPUs all read clean last time: its early read is --query-gpu.
    "status-seen-clean": ({}, False),
}


def shellcheck() -> str | None:
    return shellcheck_path()


def rendered(case: str) -> str:
    extra, check = CASES[case]
    pb = load_playbook(case.removesuffix("-check").removesuffix("-seen-clean"))
    return render_script(resolve(pb, {}, extra), check=check, host_name="node01",
                         last_clean=case.endswith("-seen-clean"))


def own_part(script: str) -> str:
    """The script with each packaged template's text (as scripts carry it: ``carried``)
    replaced by a marker line; lib.sh must be there, once and whole, in every script. The
    definitions a status script parses only when called (``engine/lazy.py``) are put back
    in place of their stand-ins first, and the end that held them says how many there were."""
    script = joined(script)
    lib = carried(template("lib.sh"))
    assert script.count(lib) == 1, "lib.sh must appear once, whole, in every script"
    for path in sorted(STAGES.glob("*.sh")):
        text = carried(path.read_text(encoding="utf-8"))
        if text in script:
            script = script.replace(text, marker(path.name), 1)
    return script


def joined(script: str) -> str:
    if lazy.mark(1) not in script:
        return script
    script, _, rest = script.partition(lazy.mark(1))
    groups = rest.split(lazy.mark(2))
    said = []
    for group, text in enumerate(groups, 1):
        waiting = list(lazy._FUNCTION.finditer(text))
        for m in waiting:
            name = m.group(1)
            stand_in = f'{name}() {{ fc_lazy {group} {name}; {name} "$@"; }}\n'
            assert script.count(stand_in) == 1, name
            script = script.replace(stand_in, m.group(0))
        assert "".join(m.group(0) for m in waiting) == text
        said.append(f"{lazy.mark(group)}# [{len(waiting)} functions, put back in their places]\n")
    return script + "".join(said)


def check_golden(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with FLEETCLEAN_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; regenerate and review the diff"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_rendered_script(case: str) -> None:
    check_golden(GOLDEN / f"{case}.sh", own_part(rendered(case)))


def test_golden_templates_pinned() -> None:
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  fleetclean/engine/stages/{p.name}\n"
             for p in sorted(STAGES.glob("*.sh"))]
    check_golden(GOLDEN / "templates.sha256", "".join(lines))


def test_a_status_script_carries_no_kill_library() -> None:
    assert marker("lib-kill.sh") not in own_part(rendered("status"))
    assert marker("lib-kill.sh") in own_part(rendered("pre-restart"))


def test_a_status_script_carries_no_stage_driver_and_reads_itself_whole_first() -> None:
    status, teardown = rendered("status"), rendered("pre-restart")
    assert marker("lib-stage.sh") not in own_part(status)
    assert marker("lib-stage.sh") in own_part(teardown)
    # The status script starts its GPU read and then its kernel log's on lines of their own,
    # before the bootstrap: bash runs each as soon as it has read that line. First of all,
    # on a line of its own, bash leaves POSIX mode, where bash 4.4 cannot parse a <(...).
    shebang, _, posix_off, gpu, klog, bootstrap, body = status.split("\n", 6)
    assert shebang == "#!/usr/bin/env bash" and posix_off == "set +o posix"
    assert "exec {FC_VQFD}< <(" in gpu and "nvidia-smi -q" in gpu and "read -r -N" not in gpu
    assert "exec {FC_VGFD}< <(" in gpu and "nvidia-smi --query-gpu" in gpu
    assert "exec {FC_VXIDFD}< <(" in klog and "read -r -N" not in klog
    assert f"read -r -N {len(body.encode())} FC_SRC;" in bootstrap
    shebang, _, posix_off, bootstrap, body = teardown.split("\n", 4)
    assert shebang == "#!/usr/bin/env bash" and posix_off == "set +o posix"
    assert f"read -r -N {len(body.encode())} FC_SRC;" in bootstrap
    assert "FC_VQFD" not in bootstrap


@pytest.mark.skipif(shellcheck() is None, reason="shellcheck not installed")
def test_golden_scripts_pass_shellcheck(tmp_path: Path) -> None:
    files = []
    for case in CASES:
        f = tmp_path / f"{case}.sh"
        f.write_text(rendered(case))
        files.append(str(f))
    status, report = shellcheck_each(files, *RENDERED)
    assert status == 0, report


@pytest.mark.skipif(shellcheck() is None, reason="shellcheck not installed")
def test_stage_templates_pass_shellcheck() -> None:
    """Every template with shellcheck's dataflow analysis, which the rendered scripts are
    checked without (simhelp.RENDERED)."""
    status, report = shellcheck_each(sorted(STAGES.glob("*.sh")))
    assert status == 0, report


def test_hostile_values_are_quoted_in_the_script() -> None:
    pb = load_playbook("post-extraction")
    hostile = "/dev/shm/x'; touch /tmp/pwned #$(id)`id`\n*"
    script = render_script(resolve(pb, {}, {"dump_dir": hostile}))
    assert "opt_paths=('/dev/shm/x'\"'\"'; touch /tmp/pwned #$(id)`id`\n*')" in script


def test_every_hosts_script_shares_one_copy_of_the_stage_library() -> None:
    """Issue #18: a whole script per host, kept from rendering to the run's end, was 110 MB
    of the controller's peak RSS at 1,000 hosts. The library (nearly all of a script) is
    one string for every host; each host's own part (its name, its variables) is small,
    and the text is what rendering that host alone gives."""
    from fleetclean.commands.steps import render_jobs
    from fleetclean.models import Host

    hosts = [Host("gpu01", "gpu01"), Host("gpu02", "10.0.0.2", vars={"grace": 7}),
             Host("gpu03", "gpu03")]
    _, jobs, _ = render_jobs("post-extraction", hosts, [], check=False, force=False)
    book = load_playbook("post-extraction")
    assert len({id(job.pieces[1]) for job in jobs}) == 1
    assert jobs[0].script != jobs[2].script
    for job in jobs:
        assert job.script == render_script(resolve(book, job.host.vars, {}),
                                           host_name=job.host.name)
        own = sum(len(p) for p in job.pieces) - len(job.pieces[1])
        assert own < len(job.script) // 10
