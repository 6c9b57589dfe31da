"""Who has a file open (``lib.sh``: ``fc_open_fds``), from one ``ls -l`` of every process's
descriptors in escape quoting, read in blocks: with grep on PATH to narrow it, and without;
no file name can pass one process's descriptors off as another's or look like a GPU; the
guard finds writers under odd paths (the holders are processes these tests start; the
listing is of this machine's /proc, read-only); and which GPUs one process holds, for
``--gpus`` (in a throw-away namespace with fake devices)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from nsrun import namespace_available, run_in_namespace

from fleetclean.engine.stages import template


def hold(*paths: Path, write: bool = False, extra: int = 0) -> subprocess.Popen[bytes]:
    """A process of this test's own holding PATHS open (fds 20, 21, ...; for appending where
    ``write``), and ``extra`` more descriptors on /dev/null (fds 100 on: an inference
    server's workers hold many), waiting on its standard input."""
    mode = ">>" if write else "<"
    opens = "; ".join(f'exec {20 + i}{mode}"${i + 1}"' for i in range(len(paths)))
    opens += f"; for ((i = 100; i < {100 + extra}; i++)); do eval \"exec $i</dev/null\"; done"
    proc = subprocess.Popen(["bash", "-c", f"{opens}; read -r _", "hold", *map(str, paths)],
                            stdin=subprocess.PIPE)
    last = Path(f"/proc/{proc.pid}/fd/{99 + extra if extra else 19 + len(paths)}")
    deadline = time.monotonic() + 30
    while not last.exists():
        assert time.monotonic() < deadline, "the holder did not open its descriptors"
        time.sleep(0.01)
    return proc


def open_fds(prefix: Path | str, path: str | None = None) -> list[str]:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c", template("lib.sh") + '\nfc_open_fds "$1"',
         "fds", str(prefix)],
        capture_output=True, text=True, check=True, timeout=60, env=env).stdout.splitlines()


@pytest.mark.parametrize("with_grep", [True, False])
def test_the_holder_of_a_file_is_found_among_900_descriptors(tmp_path: Path,
                                                             with_grep: bool) -> None:
    target = tmp_path / "weights.safetensors"
    target.touch()
    path = os.environ["PATH"]
    if not with_grep:
        only_ls = tmp_path / "bin"
        only_ls.mkdir()
        (only_ls / "ls").symlink_to(shutil.which("ls") or "/bin/ls")
        path = str(only_ls)
    proc = hold(target, write=True, extra=900)  # 900: under the usual limit of 1,024
    try:
        out = open_fds(target, path)
        assert f"{proc.pid} 20 {target}" in out
        assert all(line.split(" ", 2)[2].startswith(str(target)) for line in out)
    finally:
        proc.kill()  # only the process this test started, by its PID
        proc.wait()


def test_a_file_name_cannot_pass_its_descriptors_off_as_another_process(tmp_path: Path
                                                                         ) -> None:
    # A path that, written as it is, would end the holder's line and start a "process
    # VICTIM" heading: the descriptor listed after it (the target) would look like the
    # victim's.
    victim_file = tmp_path / "victim-file"
    victim_file.touch()
    victim = hold(victim_file)
    trap = tmp_path / "x\n" / "proc" / str(victim.pid) / "fd:"
    trap.parent.mkdir(parents=True)
    trap.touch()
    target = tmp_path / "weights.bin"
    target.touch()
    holder = hold(trap, target)
    try:
        assert open_fds(target) == [f"{holder.pid} 21 {target}"]
    finally:
        for proc in (victim, holder):  # only what this test started, by PID
            proc.kill()
            proc.wait()


def test_a_path_with_an_arrow_is_no_gpu(tmp_path: Path) -> None:
    fake = tmp_path / "a -> " / "dev" / "nvidia0"  # listed as ".../a -> /dev/nvidia0"
    fake.parent.mkdir(parents=True)
    fake.touch()
    proc = hold(fake)
    try:
        check = (template("lib.sh") + "\n" + template("lib-kill.sh") +
                 '\nif fc_holds_gpu "$1"; then echo gpu; else echo none; fi')
        out = subprocess.run(["bash", "-c", check, "x", str(proc.pid)], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        assert out.strip() == "none"
        # Nor can the dates in a line, whatever TIME_STYLE the login sets.
        out = subprocess.run(["bash", "-c", check, "x", str(proc.pid)], capture_output=True,
                             text=True, check=True, timeout=60,
                             env={**os.environ, "TIME_STYLE": "+%H -> /dev/nvidia0"}).stdout
        assert out.strip() == "none"
    finally:
        proc.kill()
        proc.wait()


def test_a_path_with_spaces_and_other_bytes_is_found_and_a_failing_grep_is_not_trusted(
        tmp_path: Path) -> None:
    target = tmp_path / "mod\u00e8les v2\tfinal" / "w.bin"
    target.parent.mkdir()
    target.touch()
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "grep").write_text("#!/bin/sh\nexit 2\n")
    (broken / "grep").chmod(0o755)
    proc = hold(target)
    try:
        escaped = str(tmp_path).replace(" ", "\\ ") + "/mod\\303\\250les\\ v2\\tfinal/w.bin"
        assert open_fds(target) == [f"{proc.pid} 20 {escaped}"]
        assert open_fds(target, f"{broken}:{os.environ['PATH']}") == [
            f"{proc.pid} 20 {escaped}"]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_names_are_escaped_as_ls_escapes_them(tmp_path: Path, locale: str) -> None:
    # Every byte but NUL and "/", alone and between letters; spaces, backslashes and
    # UTF-8 where they sit; the caller's locale does not matter (ls's is always C).
    names = [bytes([b]) for b in range(1, 256) if b != 0x2F]
    names += [b"a" + n + b"z" for n in names]
    names += [b"sp ace", b"trailing ", b"back\\", "\u00e9t\u00e9".encode()]
    paths = []
    for i, name in enumerate(names):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / os.fsdecode(name)).touch()
        paths.append(os.fsencode(folder) + b"/" + name)
    ours = subprocess.run(
        ["bash", "-c", template("lib.sh") +
         '\nfor p in "$@"; do fc_ls_escape "$p"; printf "%s\\n" "$REPLY"; done', "x", *paths],
        capture_output=True, check=True, timeout=60,
        env={**os.environ, "LC_ALL": locale}).stdout.splitlines()
    theirs = subprocess.run(["ls", "-d", "-U", "--", *paths], capture_output=True, check=True,
                            timeout=60, env={**os.environ, "LC_ALL": "C",
                                             "QUOTING_STYLE": "escape"}).stdout.splitlines()
    assert len(ours) == len(paths)
    assert ours == theirs


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
for i in {0..7}; do
    FC_GPU_INDEX_OF_MINOR[$i]=$i
    FC_GPU_INDEX_OF_UUID[GPU-0000000$i-fake-fake-fake-00000000000$i]=$i  # fake_nvidia_smi's
done
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


@pytest.mark.parametrize("name", ["model-00001.safetensors", "ends in a space "])
def test_the_guard_names_the_writer_of_a_file_under_a_path_with_a_space(tmp_path: Path,
                                                                        name: str) -> None:
    shard = tmp_path / "hf cache" / name
    shard.parent.mkdir()
    shard.touch()
    writer = hold(shard, write=True)
    reader = hold(shard)
    try:
        out = subprocess.run(
            ["bash", "-c", template("lib.sh") + "\n" + template("guard.sh") +
             '\nfc_writers "$1"; echo "$REPLY"', "x", str(shard.parent / name)],
            capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        assert out.startswith(f"pid {writer.pid} (bash -c ")  # the writer, not the reader
        assert f"pid {reader.pid} " not in out
    finally:
        for proc in (writer, reader):  # only what this test started, by PID
            proc.kill()
            proc.wait()


def test_without_grep_a_prefix_naming_fd_colon_is_still_looked_for(tmp_path: Path) -> None:
    target = tmp_path / "fd:" / "w.bin"  # the prefix itself holds "/fd:"
    target.parent.mkdir()
    target.touch()
    only_ls = tmp_path / "bin"
    only_ls.mkdir()
    (only_ls / "ls").symlink_to(shutil.which("ls") or "/bin/ls")
    proc = hold(target)
    try:
        assert open_fds(target, str(only_ls)) == [f"{proc.pid} 20 {target}"]
    finally:
        proc.kill()
        proc.wait()
