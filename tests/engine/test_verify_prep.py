"""A status reads the processes its host's last status named while its GPU read runs
(``verify.sh``: ``fc_verify_prep``, the PIDs in ``FC_VHINT``): what it reads, when it stops,
and that a process read early is named as one read after the GPU read would be.

Each case is one ``bash`` with the packaged files loaded; the GPU read is a pipe of the
test's (``FC_VQFD``), and the processes are ones the test started itself, by PID."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from fleetclean.engine.stages import template

# The prep (the read answers after READ_AT), then what it read of each PID ("read": FC_VREAD,
# FC_VPREP, FC_OWNER_PREP), then its "proc" record.
BODY = r"""
FC_CHECK=1 FC_PROTECT=(sshd)
fc_rec() { local IFS=$'\t'; printf '%s\n' "$*"; }
exec {FC_VQFD}< <(exec 2>/dev/null; ${READ_AT:-sleep 5}; echo done)
eval "${BEFORE:-}"
fc_verify_prep
for pid in $SHOW; do
    echo "read $pid ${FC_VREAD[$pid]:-no} ${FC_VPREP[$pid]:-no} ${FC_OWNER_PREP[$pid]:-no}"
done
eval "${AFTER:-}"
for pid in $SHOW; do fc_verify_proc "$pid"; done
"""


def bash(env: dict[str, str]) -> list[str]:
    script = "\n".join([template("lib.sh"), template("owner.sh"), template("verify.sh"),
                        BODY])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", **env}, check=True)
    return out.stdout.splitlines()


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's own, with a marker no other process has."""
    marker = f"fcprep-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["bash", "-c", f"exec -a '{marker}' sleep 60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def test_the_processes_named_last_time_are_read_before_the_gpu_read_answers(
    worker: subprocess.Popen[bytes],
) -> None:
    pid = worker.pid
    # A PID no process has, and words that are no PID, are passed over.
    out = bash({"FC_VHINT": f"x {pid} 4194303 -3 0{pid}", "SHOW": f"{pid} 4194303"})
    assert f"read {pid} 1 1 1" in out
    assert "read 4194303 no no no" in out
    proc = [line.split("\t") for line in out if line.startswith("proc\t")]
    assert [p[:4] for p in proc] == [["proc", str(pid), "root", cmdline(pid)],
                                     ["proc", "4194303", "", ""]]
    assert any(line.startswith(f"owner\t{pid}\t") for line in out)


def test_nothing_is_read_once_the_gpu_read_has_answered(
    worker: subprocess.Popen[bytes],
) -> None:
    # The read's output is there before the prep starts: the status goes on at once, and
    # names the process after the rows, as without the hint.
    out = bash({"FC_VHINT": str(worker.pid), "SHOW": str(worker.pid), "READ_AT": "true",
                "BEFORE": "sleep 0.2"})
    assert f"read {worker.pid} no no no" in out
    assert [line.split("\t")[3] for line in out if line.startswith("proc\t")] == [
        cmdline(worker.pid)]


def test_a_pid_taken_by_another_process_since_the_prep_is_read_again(
    worker: subprocess.Popen[bytes],
) -> None:
    # As if the process read early had ended and its PID gone to this one: the start time
    # differs, so what the prep read of it is dropped.
    pid = worker.pid
    out = bash({"FC_VHINT": str(pid), "SHOW": str(pid),
                "AFTER": f"FC_START[{pid}]=1 FC_CMD[{pid}]=stale FC_VUSER[{pid}]=nobody "
                         f"FC_OK[{pid}]=docker"})
    proc = [line.split("\t") for line in out if line.startswith("proc\t")]
    assert [p[:4] for p in proc] == [["proc", str(pid), "root", cmdline(pid)]]
    owner = [line.split("\t") for line in out if line.startswith(f"owner\t{pid}\t")]
    assert owner and owner[0][2] != "docker"


# The report of one app (the worker), each write's records counted.
REPORT = r"""
FC_CHECK=1 FC_PROTECT=(sshd)
fc_write() { local n="${1//[!$'\n']/}"; echo "write ${#n}"; }
exec {FC_VQFD}< <(exec 2>/dev/null; sleep 5; echo done)
fc_verify_prep
FC_VAPPS=("$PID, python, 100, GPU-1")
declare -gA FC_VPIDS=() FC_VHOLD=() FC_VPROT=() FC_VDEV=()
FC_VBARE=()
fc_hold
fc_verify_report
fc_release
"""


@pytest.mark.parametrize(("hint", "writes"), [
    # Read while the GPU read ran: app, owner and proc records in one write.
    (True, ["write 3"]),
    # Read now: what is held goes out before its command line is read.
    (False, ["write 1", "write 2"]),
])
def test_a_process_read_early_is_reported_in_one_write(
    worker: subprocess.Popen[bytes], hint: bool, writes: list[str],
) -> None:
    script = "\n".join([template("lib.sh"), template("owner.sh"), template("verify.sh"),
                        REPORT])
    env = {"PATH": "/usr/bin:/bin", "PID": str(worker.pid),
           "FC_VHINT": str(worker.pid) if hint else ""}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env=env, check=True)
    assert out.stdout.splitlines() == writes
