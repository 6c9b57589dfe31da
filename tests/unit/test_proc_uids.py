"""A process's uids (lib.sh: fc_proc_uids), which say who may signal it, whose it is and
whether it is in a ``--user`` scope, read from a process that wakes and sleeps all the
time, as a serving process does: its status file changes as it is read. Read a line at a
time, its ``Uid:`` line was now and then never found, and the process taken for gone (a
``--user`` run then left it running, "not user X's")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetclean.engine.stages import template

# Wakes every 50 us, a little work each time: its State: line flips between R and S.
WAKER = """
import time
end = time.monotonic() + 30
while time.monotonic() < end:
    sum(range(50))
    time.sleep(0.00005)
"""


def reads(pid: int, n: int) -> tuple[int, str]:
    """(misses in ``n`` reads of PID's uids and of its ignored signals, the uids of the
    last read that found them)."""
    script = template("lib.sh") + f"""
miss=0 got=""
for ((i = 0; i < {n}; i++)); do
    if fc_proc_uids {pid}; then got="${{FC_UIDS[*]}}"; else miss=$((miss + 1)); fi
    # A field further down, as the kill stages read a mask (ShdPnd, SigIgn).
    fc_proc_field /proc/{pid}/status SigIgn && [[ $REPLY == +([0-9a-f]) ]] || miss=$((miss + 1))
done
echo "$miss $got"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=120).stdout.split(" ", 1)
    return int(out[0]), out[1].strip()


@pytest.mark.parametrize("uid", [None, 65534], ids=["own", "another-user"])
def test_a_process_waking_all_the_time_is_read_every_time(uid: int | None) -> None:
    if uid is not None and os.geteuid() != 0:
        pytest.skip("starts a process as nobody: needs root")
    argv = [sys.executable, "-c", WAKER]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    waker = subprocess.Popen(argv)
    try:
        misses, uids = reads(waker.pid, 3000)
        assert waker.poll() is None  # it ran all along (a waker that could not start: no race)
        want = os.geteuid() if uid is None else uid
        assert (misses, uids) == (0, f"{want} {want} {want} {want}")
        # Gone: false, nothing set.
        waker.kill()
        waker.wait(timeout=10)
        assert reads(waker.pid, 1) == (2, "")
    finally:
        waker.kill()
        waker.wait(timeout=10)
