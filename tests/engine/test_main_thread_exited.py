"""A process whose main thread called ``pthread_exit`` while its other threads work on:
its leader is a zombie (``ps``: ``Zl``, no command line, an empty /proc/PID/fd), the
process alive in those threads, its files open, its GPU held. ``lib.sh`` tells it from a
killed process whose leader looks the same (item 58: a thread that waits in the driver
outlives the kill) by its threads: a killed process's are in their exit (PF_EXITING) or
have SIGKILL pending. Read on this machine's own processes, which the test starts and
ends by PID; the killed cases are the live one's threads read with a flag or a pending
SIGKILL added (``fc_read_stat`` faked, as tests/engine/test_scan.py fakes a kernel
thread): the kernel leaves a killed thread in that state only while it waits somewhere
(the simulated nodes' driver: tests/e2e/test_e2e_main_thread.py).
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
                                             "lib-kill.sh"))
# Every read of a thread's stat (PID/task/TID, TID not PID) gets $FAKE_STATE for its state,
# $FAKE_FLAGS added to its flags and $FAKE_PENDING to its pending signals (field 31).
FAKE = r"""
eval "$(declare -f fc_read_stat | sed '1s/fc_read_stat/fc_read_stat_real/')"
fc_read_stat() {
    fc_read_stat_real "$1" || return 1
    [[ $1 == */task/* && ${1##*/} != "${1%%/*}" ]] || return 0
    FC_F[0]=${FAKE_STATE:-${FC_F[0]}}
    FC_F[6]=$((FC_F[6] | ${FAKE_FLAGS:-0}))
    FC_F[28]=$((FC_F[28] | ${FAKE_PENDING:-0}))
}
"""
# For each PID given: its table entry, whether it is alive (by its start time and command
# line, as a stage waits for its targets to go), in an exit that waits in the kernel, and
# the holders of $HELD's file.
READ = r"""
for p in "$@"; do
    fc_proc_fill "$p"
    printf '%s state=%s cmd=[%s] dir=[%s]' "$p" "${FC_STATE[$p]}" "${FC_CMD[$p]}" \
        "${FC_LIVE_DIR[$p]:-}"
    fc_alive "$p" "${FC_START[$p]}" "${FC_CMD[$p]:-x}" && printf ' alive' || printf ' gone'
    fc_exit_waits "$p" "${FC_START[$p]}" && printf ' waits\n' || printf '\n'
done
fc_open_fds "$HELD"
"""
# The main thread opens FILE and ends (pthread_exit); a second thread sleeps on.
PROGRAM = ("import ctypes, os, sys, threading, time; held = open(sys.argv[1]); "
           "threading.Thread(target=lambda: time.sleep(600)).start(); "
           "print(os.getpid(), flush=True); ctypes.CDLL(None).pthread_exit(None)")


def state(pid: int) -> tuple[str, int]:
    """(state, number of threads) of PID."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return fields[0], int(fields[17])


@pytest.fixture
def held(tmp_path: Path) -> Path:
    path = tmp_path / "held-by-a-thread"
    path.write_text("")
    return path


@pytest.fixture
def main_exited(held: Path) -> Iterator[int]:
    """The PID of a process of ours whose main thread has ended, another one working on."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(held), "main-exited-marker"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while state(pid) != ("Z", 2):
            assert time.monotonic() < deadline, state(pid)
            time.sleep(0.01)
        yield pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def zombie() -> Iterator[int]:
    """A plain zombie of ours: a child ended and not yet waited for."""
    proc = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while state(proc.pid)[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.wait(timeout=10)


def read(held: Path, *pids: int, **fake: str) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "HELD": str(held)}
    env.update({f"FAKE_{key.upper()}": value for key, value in fake.items()})
    done = subprocess.run(["bash", "-c", LIBS + FAKE + READ, "read", *map(str, pids)],
                          check=False, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_process_whose_main_thread_exited_is_alive_and_read_by_its_thread(
    held: Path, main_exited: int, zombie: int,
) -> None:
    pid = main_exited
    (tid,) = (t.name for t in Path(f"/proc/{pid}/task").iterdir() if t.name != str(pid))
    command = f"{sys.executable} -c {PROGRAM} {held} main-exited-marker"
    lines = read(held, pid, zombie)
    # Its state, command line and descriptors are its living thread's; it is alive.
    assert lines[0] == f"{pid} state=S cmd=[{command}] dir=[{pid}/task/{tid}] alive"
    # A plain zombie is dead, as before.
    assert lines[1] == f"{zombie} state=Z cmd=[] dir=[] gone"
    # The file its main thread opened is held, by the process, through its thread.
    assert [line.split(" ", 2)[0::2] for line in lines[2:]] == [[str(pid), str(held)]]


@pytest.mark.parametrize(("fake", "what"), [
    ({"pending": "0x100"}, "SIGKILL pending"),
    ({"flags": "0x4"}, "in its exit (PF_EXITING)"),
    ({"flags": "0x200"}, "dumping its core"),
])
def test_a_zombie_leader_whose_threads_were_killed_is_gone(
    held: Path, main_exited: int, fake: dict[str, str], what: str,
) -> None:
    pid = main_exited
    lines = read(held, pid, **fake)
    assert lines[0] == f"{pid} state=Z cmd=[] dir=[] gone", what
    assert lines[1:] == []  # its files are no process's that a stage would signal


def test_a_thread_in_the_kernel_is_stuck_once_killed_and_alive_before(
    held: Path, main_exited: int,
) -> None:
    # Item 58's case: killed, the thread that waits in the driver (state D) keeps SIGKILL
    # pending, and the process is an exit that waits in the kernel (stuck, not a live
    # holder). The same thread in D with nothing pending is a live process's driver call.
    pid = main_exited
    (killed,) = read(held, pid, state="D", pending="0x100")[:1]
    assert killed == f"{pid} state=Z cmd=[] dir=[] gone waits"
    (alive,) = read(held, pid, state="D")[:1]
    assert alive.startswith(f"{pid} state=D cmd=[{sys.executable} -c ") and alive.endswith(
        " alive")
