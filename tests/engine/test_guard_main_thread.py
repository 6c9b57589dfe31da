"""The guard (guard.sh: fc_writers) and a writer whose main thread called ``pthread_exit``
while another thread writes on: its leader is a zombie (``ps``: ``Zl``) whose
/proc/PID/fd and fdinfo read empty. The guard ran no scan, so it never read the process by
its living thread (lib.sh: fc_live_thread), saw no writer, and let a teardown remove the
directory being written. Read on this machine's own processes, which the test starts and
ends by PID (tests/engine/test_main_thread_exited.py reads such a process's table entry).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetclean.engine.stages import template

LIBS = "\n".join(template(name) for name in ("lib.sh", "lib-match.sh", "lib-stage.sh",
                                             "lib-kill.sh", "guard.sh"))
# The guard stage itself, as a teardown runs it: its status and message; then the writers
# fc_writers names.
GUARD = r"""
FC_FORCE=0 FC_STATUS=ok FC_HALT=0 FC_STAGE_NAME=guard-writers
opt_path=$1 opt_wait_for_file="" opt_wait_for_line="" opt_timeout_ms=300
fc_rec() { :; }
fc_stage_guard
printf 'status=%s halt=%s message=%s\n' "$FC_STATUS" "$FC_HALT" "$FC_MESSAGE"
fc_writers "$1"
printf 'writers=%s\n' "$REPLY"
"""
# The main thread opens FILE for writing, starts a thread that writes to it, and ends
# (pthread_exit); a reader of the same file does the same, writing nothing.
WRITER = ("import ctypes, os, sys, threading, time; f = open(sys.argv[1], sys.argv[2] + 'b', 0); "
          "threading.Thread(target=lambda: [(f.write(b'x') if 'a' in sys.argv[2] else None, "
          "time.sleep(0.05)) for _ in range(12000)]).start(); "
          "print(os.getpid(), flush=True); ctypes.CDLL(None).pthread_exit(None)")


def state(pid: int) -> tuple[str, int]:
    """(state, number of threads) of PID."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return fields[0], int(fields[17])


def start(path: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert int(proc.stdout.readline()) == proc.pid
    deadline = time.monotonic() + 10
    while state(proc.pid) != ("Z", 2):
        assert time.monotonic() < deadline, state(proc.pid)
        time.sleep(0.01)
    return proc


@pytest.fixture
def dump(tmp_path: Path) -> Iterator[tuple[Path, int, int]]:
    """A dump directory, the PID of a writer whose main thread has ended, and of a reader."""
    path = tmp_path / "sglang_hs"
    path.mkdir()
    (path / "dump.bin").write_text("")
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(start(path / "dump.bin", "a"))
        procs.append(start(path / "dump.bin", "r"))
        yield path, procs[0].pid, procs[1].pid
    finally:
        for proc in procs:  # only what this test started, by PID
            proc.kill()
            proc.wait(timeout=10)


def test_the_guard_refuses_while_a_writer_whose_main_thread_exited_writes(
    dump: tuple[Path, int, int],
) -> None:
    path, writer, reader = dump
    assert state(writer)[0] == "Z" and not list(Path(f"/proc/{writer}/fd").iterdir())
    size = (path / "dump.bin").stat().st_size
    done = subprocess.run(["bash", "-c", LIBS + GUARD, "guard", str(path)], check=False,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    status, writers = done.stdout.splitlines()
    # Named by its living thread's command line (the guard's list puts ", " for each comma).
    named = f"pid {writer} ({sys.executable} -c import ctypes, "
    assert status.startswith(f"status=refused halt=1 message=refused: {path} has writers: "
                             f"{named}")
    assert status.endswith(f" {path / 'dump.bin'} a)")
    assert writers.startswith(f"writers={named}")  # the writer, not the reader
    assert f"pid {reader} " not in done.stdout
    assert (path / "dump.bin").stat().st_size > size  # it was writing all along


def test_the_guard_sees_it_without_grep(dump: tuple[Path, int, int], tmp_path: Path) -> None:
    # Without grep on the node every stat is read in bash.
    path, writer, _ = dump
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ls").symlink_to("/bin/ls")
    done = subprocess.run(["/bin/bash", "-c", LIBS + GUARD, "guard", str(path)], check=False,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith(f"writers=pid {writer} (")


# verify.sh reads early the command line of a process named last time, once it and its
# ancestors are awake (fc_verify_prep_awake: stat files alone). Every read of a thread's
# stat (PID/task/TID, TID not PID) gets $FAKE_STATE for its state.
AWAKE = r"""
eval "$(declare -f fc_read_stat | sed '1s/fc_read_stat/fc_read_stat_real/')"
fc_read_stat() {
    fc_read_stat_real "$1" || return 1
    [[ $1 == */task/* && ${1##*/} != "${1%%/*}" ]] || return 0
    FC_F[0]=${FAKE_STATE:-${FC_F[0]}}
}
fc_read_stat_real "$1"
fc_verify_prep_awake "$1" "${FC_F[19]}" && echo awake || echo asleep
"""


@pytest.mark.parametrize(("fake", "said"), [("", "awake"), ("S", "awake"), ("D", "asleep")])
def test_a_process_whose_living_thread_is_in_d_is_not_read_early(
    dump: tuple[Path, int, int], fake: str, said: str,
) -> None:
    # Its leader a zombie, its command line is read by its other thread: one in D (its
    # memory map held) could make that read wait, as the leader's own state D does.
    _, writer, _ = dump
    script = "\n".join([template("lib.sh"), template("verify.sh"), AWAKE])
    done = subprocess.run(["bash", "-c", script, "awake", str(writer)], check=False,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FAKE_STATE": fake})
    assert (done.returncode, done.stdout) == (0, f"{said}\n"), done.stderr
