"""Who has a file open (``lib.sh``: ``fc_open_fds``), from one ``ls -l`` of every process's
descriptors read in blocks: with grep on PATH to narrow it, and without (the holder is a
process this test starts; the listing is of this machine's /proc, read-only); and which
GPUs one process holds, for ``--gpus`` (in a throw-away namespace with fake devices)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from nsrun import namespace_available, run_in_namespace

from fleetclean.engine.stages import template

# A holder of many descriptors (an inference server's worker holds thousands), one of them
# the file FILE, open for writing as fd 7; it waits on its standard input.
HOLDER = r"""
exec 7>"$1"
for ((i = 10; i < 1200; i++)); do eval "exec $i</dev/null"; done
read -r _
"""


@pytest.fixture
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    target = tmp_path / "weights.safetensors"
    target.touch()
    proc = subprocess.Popen(["bash", "-c", HOLDER, "holder", str(target)],
                            stdin=subprocess.PIPE)
    fd7 = Path(f"/proc/{proc.pid}/fd/7")
    for _ in range(500):
        if fd7.exists() and Path(f"/proc/{proc.pid}/fd/1199").exists():
            break
        subprocess.run(["sleep", "0.01"], check=True)
    try:
        yield proc.pid, target
    finally:
        proc.kill()  # only the process this test started, by its PID
        proc.wait()


@pytest.mark.parametrize("with_grep", [True, False])
def test_the_holder_of_a_file_is_found_among_a_thousand_descriptors(
        holder: tuple[int, Path], tmp_path: Path, with_grep: bool) -> None:
    pid, target = holder
    path = os.environ["PATH"]
    if not with_grep:
        only_ls = tmp_path / "bin"
        only_ls.mkdir()
        (only_ls / "ls").symlink_to(shutil.which("ls") or "/bin/ls")
        path = str(only_ls)
    out = subprocess.run(
        ["bash", "-c", template("lib.sh") + '\nPATH=$2 fc_open_fds "$1"', "fds", str(target),
         path], capture_output=True, text=True, check=True, timeout=60).stdout
    assert f"{pid} 7 {target}" in out.splitlines()
    assert all(line.split()[2].startswith(str(target)) for line in out.splitlines())


# Which GPUs a process holds, for --gpus (scope.sh: fc_holds_only_other_gpus): the holders
# are workloads in a throw-away namespace with fake /dev/nvidia0..7; GPU 1 is the scope.
SCOPE_SETUP = """
spawn in --hold /dev/nvidia1 holds-in-scope
spawn out --hold /dev/nvidia5 holds-out-of-scope
spawn both --hold /dev/nvidia5 --hold /dev/nvidia1 holds-both
spawn none holds-no-gpu
"""
SCOPE_SCRIPT = r"""
FC_SCOPE_GPUS_ON=1
FC_SCOPE_GPU=([1]=1)
for i in {0..7}; do FC_GPU_INDEX_OF_MINOR[$i]=$i; done
for d in /proc/[0-9]*; do
    read -r -d '' cmd <"$d/cmdline" 2>/dev/null  # the workloads' titles: holds-TAG
    [[ $cmd == holds-* ]] || continue
    if fc_holds_only_other_gpus "${d#/proc/}"; then echo "${cmd#holds-} other"
    else echo "${cmd#holds-} -"; fi
done
"""


@pytest.mark.skipif(not namespace_available(), reason="needs root and unshare")
def test_a_process_is_out_of_a_gpu_scope_only_when_every_gpu_it_holds_is() -> None:
    result = run_in_namespace(
        "\n".join([template("lib.sh"), template("scope.sh"), SCOPE_SCRIPT]),
        setup=SCOPE_SETUP)
    said = dict(line.split() for line in result.stdout.split("__RC__")[0].splitlines()
                if line.endswith((" other", " -")))
    assert said == {"in-scope": "-", "out-of-scope": "other", "both": "-", "no-gpu": "-"}
