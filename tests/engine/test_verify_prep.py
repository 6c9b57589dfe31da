"""A status reads the processes its host's last status named while its GPU read runs
(``verify.sh``: ``fc_verify_prep``, ``FC_VHINT``'s PID:START words): what it reads, when it stops,
and that each process read early is named as one read after the GPU read would be.

Each case is one ``bash`` with the packaged files loaded; the GPU read is a pipe of the
test's (``FC_VQFD``), and the processes are ones the test started itself, by PID."""

from __future__ import annotations

import itertools
import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetclean.engine.stages import template

# SETUP, then the prep (the read answers after READ_AT), then what it read of each PID
# ("read": FC_VREAD, FC_VPREP, FC_OWNER_PREP), AFTER, then each one's records.
BODY = r"""
FC_CHECK=1 FC_PROTECT=(sshd) FC_VHINT=$HINT
fc_rec() { local IFS=$'\t'; printf '%s\n' "$*"; }
exec {FC_VQFD}< <(exec 2>/dev/null; ${READ_AT:-sleep 5}; echo done)
eval "${SETUP:-}"
fc_verify_prep
for pid in $SHOW; do
    echo "read $pid ${FC_VREAD[$pid]:-no} ${FC_VPREP[$pid]:-no} ${FC_OWNER_PREP[$pid]:-no}"
done
eval "${AFTER:-}"
for pid in $SHOW; do fc_verify_proc "$pid"; done
"""
ME = pwd.getpwuid(os.geteuid()).pw_name


def bash(env: dict[str, str], body: str = BODY) -> list[str]:
    script = "\n".join([template("lib.sh"), template("owner.sh"), template("verify.sh"),
                        body])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", **env}, check=True)
    return out.stdout.splitlines()


def records(out: list[str], kind: str) -> list[list[str]]:
    return [line.split("\t")[1:] for line in out if line.startswith(f"{kind}\t")]


def start(argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", "-c", argv], stdout=subprocess.PIPE)


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes of this test's own, each with a marker no other process has."""
    procs = [start(f"exec -a 'fcprep-{uuid.uuid4().hex}' sleep 60") for _ in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def hint(*pids: int) -> str:
    """FC_VHINT's words for ``pids``: PID:START, the start time from their stat."""
    return " ".join(f"{pid}:{start_of(pid)}" for pid in pids)


def start_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode()


def test_the_processes_named_last_time_are_read_before_the_gpu_read_answers(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    pid, other = (w.pid for w in workers)
    start = start_of(pid)
    # Words that are no PID:START, a PID no process has, and a process whose start time is
    # not the one named (its PID another's since: after a reboot, or once it ended) are
    # passed over.
    words = (f"x {pid} {pid}:{start + 1} 4194303:{start} -3:1 0{pid}:{start} * "
             f"{other}:{start_of(other) + 7} {pid}:{start}")
    out = bash({"HINT": words, "SHOW": f"{pid} 4194303 {other}"})
    assert f"read {pid} 1 1 1" in out and "read 4194303 no no no" in out
    assert f"read {other} no no no" in out
    assert [p[:3] for p in records(out, "proc")] == [[str(pid), ME, cmdline(pid)],
                                                    ["4194303", "", ""],
                                                    [str(other), ME, cmdline(other)]]
    # Each one's start time goes with it: what the next status reads early.
    assert [p[5] for p in records(out, "proc")] == [str(start), "", str(start_of(other))]
    assert [o[0] for o in records(out, "owner")] == [str(pid), str(other)]


def test_each_process_read_early_gets_its_own_owner(
    workers: list[subprocess.Popen[bytes]], tmp_path: Path,
) -> None:
    # Owners their cgroups name whatever their ancestors (a Slurm job, a container).
    a, b = (w.pid for w in workers)
    ctr = "c" * 64
    cgroups = {1: "0::/init.scope",
               a: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
               b: f"0::/system.slice/docker-{ctr}.scope"}
    for pid, line in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(line + "\n")
    out = bash({"HINT": hint(a, b), "SHOW": f"{a} {b}", "FC_PROC": str(tmp_path)})
    assert f"read {a} 1 1 1" in out and f"read {b} 1 1 1" in out
    assert records(out, "owner") == [[str(a), "slurm", "42", "42.0"],
                                     [str(b), "docker", ctr, ctr[:12]]]


def test_nothing_is_read_once_the_gpu_read_has_answered(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    # The read's output is there before the prep starts: the status goes on at once, and
    # names the process after the rows, as without the hint.
    pid = workers[0].pid
    out = bash({"HINT": hint(pid), "SHOW": str(pid), "READ_AT": "true", "SETUP": "sleep 0.3"})
    assert f"read {pid} no no no" in out
    assert [p[2] for p in records(out, "proc")] == [cmdline(pid)]


def test_the_prep_stops_as_soon_as_the_read_answers(
    workers: list[subprocess.Popen[bytes]], tmp_path: Path,
) -> None:
    # The read answers while the first process is read: the second waits for its record.
    a, b = (w.pid for w in workers)
    fifo = tmp_path / "read"
    os.mkfifo(fifo)
    setup = (f'exec {{FC_VQFD}}<>{fifo}\n'
             'eval "$(declare -f fc_owner_prep | sed "1s/fc_owner_prep/real_prep/")"\n'
             'fc_owner_prep() { real_prep "$@"; echo answered >&"$FC_VQFD"; }')
    out = bash({"HINT": hint(a, b), "SHOW": f"{a} {b}", "SETUP": setup})
    assert f"read {a} 1 1 1" in out and f"read {b} no no no" in out
    assert [p[2] for p in records(out, "proc")] == [cmdline(a), cmdline(b)]


def stat_of(pid: int, change: str) -> str:
    """bash that makes what fc_read_stat reads of ``pid`` other by the command ``change``
    (of FC_F, its fields)."""
    return ('eval "$(declare -f fc_read_stat | sed "1s/fc_read_stat/real_stat/")"\n'
            f'fc_read_stat() {{ real_stat "$@" || return 1; [[ $1 != {pid} ]] || {change}; }}')


def test_a_process_in_uninterruptible_sleep_is_left_for_after_the_rows(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    # As if the first were in state D (stuck in the kernel: its command line's read could
    # hang): not read early, named with its records.
    a, b = (w.pid for w in workers)
    out = bash({"HINT": hint(a, b), "SHOW": f"{a} {b}", "SETUP": stat_of(a, "FC_F[0]=D")})
    assert f"read {a} no no no" in out and f"read {b} 1 1 1" in out
    assert [p[2] for p in records(out, "proc")] == [cmdline(a), cmdline(b)]


def test_a_process_in_its_exit_since_the_prep_is_named_as_exiting(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    # As if the first had begun its exit once read early (PF_EXITING in its stat's flags:
    # a read of its command line now gives it empty, "exiting" in the table).
    a, b = (w.pid for w in workers)
    after = stat_of(a, "FC_F[6]=$((FC_F[6] | 4))") + "\nfc_cmdline() { REPLY=''; FC_ARGV0_ONE=''; }"
    out = bash({"HINT": hint(a, b), "SHOW": f"{a} {b}", "AFTER": after})
    assert f"read {a} 1 1 1" in out
    assert [p[2] for p in records(out, "proc")] == ["", cmdline(b)]


def test_a_pid_taken_by_another_process_since_the_prep_is_read_again(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    # As if the process read early had ended and its PID gone to this one: the start time
    # differs, so what the prep read of it is dropped.
    pid = workers[0].pid
    out = bash({"HINT": hint(pid), "SHOW": str(pid),
                "AFTER": f"FC_START[{pid}]=1 FC_CMD[{pid}]=stale FC_VUID[{pid}]=65534 "
                         f"FC_OK[{pid}]=docker FC_OWNER_KIND=docker"})
    assert [p[:3] for p in records(out, "proc")] == [[str(pid), ME, cmdline(pid)]]
    assert [o[0] for o in records(out, "owner")] == [str(pid)]
    assert records(out, "owner")[0][1] != "docker"


def test_a_process_that_ended_or_is_a_zombie_since_the_prep_is_named_as_it_is_now(
    tmp_path: Path,
) -> None:
    # Two processes that end once the prep has read them (each waits on a FIFO the script
    # writes to): one leaves a zombie (its parent, exec'd into sleep, never reaps it), the
    # other is gone (its parent reaps it).
    fifos = [tmp_path / "z", tmp_path / "g"]
    for fifo in fifos:
        os.mkfifo(fifo)
    parents = [start(f"(read -r _ <{fifos[0]}) & echo $!; exec sleep 60"),
               start(f"(read -r _ <{fifos[1]}) & echo $!; wait")]
    try:
        zombie, gone = (int(p.stdout.readline()) for p in parents if p.stdout)
        out = bash({"HINT": hint(zombie, gone), "SHOW": f"{zombie} {gone}",
                    "AFTER": f"echo >{fifos[0]}; echo >{fifos[1]}; sleep 0.3"})
    finally:
        for proc in parents:
            proc.kill()
            proc.wait()
    assert f"read {zombie} 1 1 1" in out and f"read {gone} 1 1 1" in out
    # The zombie's command line reads empty now, as the gone one's table entries are.
    assert [p[:3] for p in records(out, "proc")] == [[str(zombie), ME, ""],
                                                    [str(gone), "", ""]]


# The report of one app (the worker), each write's records counted.
REPORT = r"""
FC_CHECK=1 FC_PROTECT=(sshd) FC_VHINT=$HINT
fc_write() { local n="${1//[!$'\n']/}"; echo "write ${#n}"; }
exec {FC_VQFD}< <(exec 2>/dev/null; sleep 5; echo done)
fc_verify_prep
eval "$(declare -f fc_cmdline | sed "1s/fc_cmdline/real_cmdline/")"
fc_cmdline() { echo "cmdline read"; real_cmdline "$@"; }
FC_VAPPS=("$PID, python, 100, GPU-1")
declare -gA FC_VPIDS=() FC_VHOLD=() FC_VPROT=() FC_VDEV=()
FC_VBARE=()
fc_hold
fc_verify_report
fc_release
"""


@pytest.mark.parametrize(("early", "writes"), [
    # Read while the GPU read ran: app, owner and proc records in one write.
    (True, ["write 3"]),
    # Read now: what is held (the app) goes out before its command line is read.
    (False, ["write 1", "cmdline read", "write 2"]),
])
def test_a_process_read_early_is_reported_in_one_write(
    workers: list[subprocess.Popen[bytes]], early: bool, writes: list[str],
) -> None:
    pid = str(workers[0].pid)
    out = bash({"PID": pid, "HINT": hint(int(pid)) if early else ""}, REPORT)
    # Its ancestors' command lines are read with its own (its owner).
    assert [line for line, _ in itertools.groupby(out)] == writes


def test_a_hint_from_the_environment_is_not_taken(
    workers: list[subprocess.Popen[bytes]],
) -> None:
    pid = str(workers[0].pid)
    body = BODY.replace("FC_VHINT=$HINT", "")
    out = bash({"FC_VHINT": hint(int(pid)), "SHOW": pid}, body)
    assert f"read {pid} no no no" in out


def test_the_early_q_read_answers_only_once_nvidia_smi_is_done(tmp_path: Path) -> None:
    # An nvidia-smi that writes its first GPUs' sections, then the rest a while later (as a
    # real one flushes an 8-GPU node's 10 KB into a pipe): the read must not look answered
    # after the first part, or the early read of the processes would stop there.
    from fleetclean.engine.render import early_reads

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 00000000:18:00.0'\nsleep 0.6\necho 'GPU 2'\n")
    fake.chmod(0o755)
    line = early_reads(q_only=True)[0]
    script = (f"{line}\nsleep 0.3\nread -t 0 -u \"$FC_VQFD\" && echo early || echo waiting\n"
              'fc_read_fd "$FC_VQFD"\nprintf "%s" "$REPLY"')
    out = subprocess.run(["bash", "-c", "\n".join([template("lib.sh"), script])],
                         capture_output=True, text=True, timeout=30, check=True,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert out.stdout == "waiting\nGPU 00000000:18:00.0\nGPU 2\n@0"


def test_the_user_names_of_processes_read_early_come_from_the_file_alone(
    workers: list[subprocess.Popen[bytes]], tmp_path: Path,
) -> None:
    """Named early where /etc/passwd has the user; a user it lacks is asked of the
    directory (up to 2 s) only after the GPU rows, never while the GPU read runs."""
    pid = workers[0].pid
    log = tmp_path / "asked"
    stub = tmp_path / "getent"
    stub.write_text(f'#!/bin/sh\necho "$3 $(cat {tmp_path}/phase)" >>{log}\nexit 2\n')
    stub.chmod(0o755)
    (tmp_path / "phase").write_text("prep")
    show = (f'echo "name {pid} ${{FC_PASSWD[$EUID]-none}}"; '
            f'echo after >{tmp_path}/phase')
    known = bash({"HINT": hint(pid), "SHOW": str(pid), "AFTER": show,
                  "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert f"name {pid} {ME}" in known
    empty = tmp_path / "passwd"
    empty.write_text("")
    lacking = bash({"HINT": hint(pid), "SHOW": str(pid), "AFTER": show,
                    "SETUP": f"FC_PASSWD_FILE={empty}", "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert f"name {pid} none" in lacking
    assert [p[:2] for p in records(lacking, "proc")] == [[str(pid), str(os.geteuid())]]
    assert log.read_text().split("\n")[:1] == [f"{os.geteuid()} after"]
