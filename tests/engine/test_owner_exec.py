"""A target that ``docker exec`` started, and the exec session it runs in (``owner-act.sh``:
``fc_exec_sessions``; RELIABILITY item 62).

The exec session is made of processes this test starts itself: its root, a shell in a
session of its own (runc makes what it execs a session leader), runs the job, a ``sleep``;
the container's main process is another ``sleep``. Both are children of this test, which
stands for the containerd-shim (their parent on a node). A fake ``docker`` on an empty
PATH names the main process; only a root that ignores SIGTERM is ever signalled (SIGKILL,
by ``fc_exec_kill_roots``), and only one this test started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetclean.engine.stages import template
from fleetclean.results.parse import parse_script_output

CID = "3f" * 32
DRIVER = r"""
FC_PROTECT=($7)
fc_rec begin 1 p h 0
fc_self_init
FC_IDX=1 FC_CHECK=$6
read -r -a FC_PIDS <<<"$1"
for p in "${FC_PIDS[@]}"; do
    fc_proc_load "$p"
    # Each in the container's cgroup, as on a node: its owner known (owner.sh).
    FC_OK[$p]=docker FC_OI[$p]=$3 FC_ON[$p]=${3:0:12} FC_OWNER_PREP[$p]=1
done
FC_OWNER_ACT=([systemd]=stop [docker]=$4 [slurm]=refuse [kubernetes]=refuse [plain]=signal)
read -r -a FC_TARGETS <<<"$2"
FC_MATCHED=${#FC_TARGETS[@]}
PATH=$5
fc_owner_act TERM 100 100
fc_rec left-to-signal "${FC_TARGETS[*]}"
fc_rec first "${FC_EXEC_FIRST[*]}"
fc_rec said "$FC_OWNER_SAID"
fc_rec matched "$FC_MATCHED"
fc_holds_gpu() { return 0; }  # each a holder: this machine has no /dev/nvidiaN
fc_note_respawn_risk "${FC_TARGETS[@]}"
fc_rec watched "$FC_RESPAWN_RISK ${!FC_WATCH_OWNER[*]}|${!FC_WATCH[*]}"
"""


class Session:
    """``shell`` (a session leader) running ``job``; ``main``, beside it."""

    def __init__(self, shell: list[str], script: str = "sleep 60; :") -> None:
        self.main_proc = subprocess.Popen(["sleep", "60"])
        self.root_proc = subprocess.Popen([*shell, script], start_new_session=True,
                                          stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.main, self.root = self.main_proc.pid, self.root_proc.pid
        children = Path(f"/proc/{self.root}/task/{self.root}/children")
        deadline = time.monotonic() + 10
        want = script.count("sleep")
        # Its name and its command line both: during exec the kernel names the process
        # before its new command line can be read (empty for a moment under load).
        while len(jobs := [int(p) for p in children.read_text().split()
                           if comm(int(p)) == "sleep" and argv(int(p)) != [""]]) < want:
            assert time.monotonic() < deadline, "the shell did not start its job"
            time.sleep(0.01)
        # The job sleeps 60; any other child (a CPU-only sibling) another time.
        (self.job,) = [p for p in jobs if argv(p) == ["sleep", "60"]]
        self.others = [p for p in jobs if p != self.job]

    def close(self) -> None:
        for pid in (*self.others, self.job, self.root, self.main):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in (self.root_proc, self.main_proc):
            proc.wait()


def argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")
    except OSError:  # gone
        return []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone
        return ""


@pytest.fixture
def session() -> Iterator[Session]:
    made = Session(["sh", "-c"])
    try:
        yield made
    finally:
        made.close()


def fake_docker(tmp_path: Path, main: int) -> Path:
    """A docker on the empty PATH ``tmp_path`` that names ``main`` the container's main
    process (PID mode private), and logs every call."""
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n"
                    f"case $1 in inspect) echo {main} ;; esac\n")
    fake.chmod(0o755)
    (tmp_path / "sort").symlink_to(shutil.which("sort") or "/usr/bin/sort")
    return log


def act(tmp_path: Path, s: Session, targets: list[int], how: str = "stop", *,
        check: bool = False, protect: str = "", after: str = "") -> str:
    script = "".join(template(t) for t in ("lib.sh", "lib-match.sh", "lib-kill.sh",
                                           "owner.sh", "owner-act.sh")) + DRIVER
    pids = " ".join(map(str, (s.main, s.root, s.job, *s.others)))
    # A file, not a `bash -c` string: the libraries with their comments pass the kernel's
    # 128 KiB limit on one argument (the rendered script has none of them).
    (tmp_path / "act.sh").write_text(f"{script}{after}fc_rec done 0\n")
    done = subprocess.run(["bash", str(tmp_path / "act.sh"), pids,
                           " ".join(map(str, targets)),
                           CID, how, str(tmp_path), str(int(check)), protect],
                          capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def rec(out: str, kind: str) -> str:
    (line,) = [r for r in out.splitlines() if r.startswith(f"@@fleetclean\t{kind}\t")]
    return line.split("\t", 2)[2]


def test_stop_ends_the_exec_session_its_root_first(tmp_path: Path, session: Session) -> None:
    # `docker exec -d CTR sh -c 'while :; do job; done'`: the job killed alone was started
    # again by its shell. The shell joins the targets, first, with what the job runs; the
    # container is not stopped, and nothing is left to watch.
    log = fake_docker(tmp_path, session.main)
    out = act(tmp_path, session, [session.job])
    assert rec(out, "left-to-signal") == f"{session.root} {session.job}"
    assert rec(out, "first") == str(session.root)
    assert rec(out, "said") == (
        f"not stopped: docker {CID[:12]} (pid {session.job} started by docker exec, not by its "
        f"main process {session.main}: its exec session {session.root} (sh) signalled "
        "first); ")
    assert rec(out, "matched") == "2"
    assert rec(out, "watched") == "0 |"
    # The root is recorded as a target is: its owner, its match.
    assert f"@@fleetclean\towner\t{session.root}\tdocker\t{CID}\t" in out
    assert f"@@fleetclean\tmatch\t1\t{session.root}\tsh -c sleep 60; :\ttree\t" in out
    assert log.read_text().splitlines() == [f"inspect -f {{{{.State.Pid}}}} "
                                            f"{{{{.HostConfig.PidMode}}}} {CID}"]
    assert parse_script_output(out, "", 0).warnings == ()


def test_check_names_the_exec_sessions_root(tmp_path: Path, session: Session) -> None:
    fake_docker(tmp_path, session.main)
    out = act(tmp_path, session, [session.job], check=True)
    assert rec(out, "left-to-signal") == f"{session.root} {session.job}"


def test_a_session_that_runs_a_protected_process_is_not_ended(
    tmp_path: Path, session: Session
) -> None:
    # Its root is protected by name here ("sh"): ending the session would reach it. The
    # job is signalled alone, its shell watched for a respawn (as item 59), and it is said.
    fake_docker(tmp_path, session.main)
    out = act(tmp_path, session, [session.job], protect="sh")
    assert rec(out, "left-to-signal") == str(session.job)
    assert rec(out, "first") == ""
    assert rec(out, "watched") == f"1 |{session.root}"
    (warning,) = parse_script_output(out, "", 0).warnings
    assert warning == (
        f"docker {CID[:12]}: exec session {session.root} (sh -c sleep 60; :) runs protected "
        f"pid {session.root} (sh -c sleep 60; :: protected name): not ended, only its targets "
        "were signalled; it may start them again")


def test_refuse_names_the_exec_session_and_what_to_kill(
    tmp_path: Path, session: Session
) -> None:
    # `docker stop` would take the whole container down for a job that is not its main
    # process's: what to do is to end the job's exec session, its root first.
    log = fake_docker(tmp_path, session.main)
    out = act(tmp_path, session, [session.job], "refuse")
    (refusal,) = parse_script_output(out, "", 0).refused
    assert (refusal.pid, refusal.who, refusal.fix) == (
        session.job, f"docker exec session {session.root} (sh) in docker container {CID[:12]}",
        f"kill {session.root} {session.job}")
    assert rec(out, "left-to-signal") == ""
    assert not [c for c in log.read_text().splitlines() if not c.startswith("inspect ")]


@pytest.mark.parametrize("target", ["root", "job"])
def test_signal_watches_an_exec_job_through_its_parent_not_its_container(
    tmp_path: Path, session: Session, target: str
) -> None:
    # owner_docker=signal: docker never starts an exec'd job again, so its container is
    # not watched (any new process there read as a respawn); its parent is, where it is
    # no shim: a job whose exec session's root is itself, none; a looping shell's job, the
    # shell.
    fake_docker(tmp_path, session.main)
    pid = session.root if target == "root" else session.job
    out = act(tmp_path, session, [pid], "signal")
    assert rec(out, "left-to-signal") == str(pid)
    assert rec(out, "watched") == ("0 |" if target == "root" else f"1 |{session.root}")


def test_a_root_that_ignores_sigterm_gets_sigkill_first(tmp_path: Path) -> None:
    # The bash of `docker exec -it CTR bash` is interactive: it ignores SIGTERM, would
    # outlive the grace and run a loop's job anew meanwhile. It gets SIGKILL at once; the
    # job the stage's TERM (left to the caller), and nothing is watched.
    s = Session(["bash", "--norc", "-ic"])
    try:
        mask = next(line for line in Path(f"/proc/{s.root}/status").read_text().splitlines()
                    if line.startswith("SigIgn:")).split()[1]
        assert int(mask, 16) & (1 << (signal.SIGTERM - 1))
        fake_docker(tmp_path, s.main)
        checked = act(tmp_path, s, [s.job], check=True)
        assert rec(checked, "left-to-signal") == str(s.job)
        assert (f"\tchange\t1\twould send KILL to {s.root} (bash --norc -ic sleep 60; :), owner "
                f"docker {CID[:12]} (started by docker exec, not its main process {s.main}) "
                f"[tree; docker exec session {s.root}]\n") in checked
        # Refused, what to do says so: a TERM would leave it.
        (refusal,) = parse_script_output(act(tmp_path, s, [s.job], "refuse"), "", 0).refused
        assert refusal.fix == f"kill -KILL {s.root}; kill {s.job}"
        assert s.root_proc.poll() is None
        out = act(tmp_path, s, [s.job])
        assert rec(out, "left-to-signal") == str(s.job)
        assert [(x.pid, x.signal) for x in parse_script_output(out, "", 0).signalled] == [
            (s.root, "KILL")]
        assert s.root_proc.wait(timeout=5) == -signal.SIGKILL
        assert rec(out, "watched") == "0 |"
    finally:
        s.close()


def test_a_cpu_only_sibling_in_the_exec_session_is_left_running(tmp_path: Path) -> None:
    # `docker exec -d CTR python3 jup.py`, which started a CPU-only child (a jupyter
    # kernel; here `sleep 61`, in the root's session and process group) beside the GPU
    # job (`sleep 60`): only the chain from the root down to the job is ended, the root
    # first; the sibling is left running (the root's end reparents it; it restarts
    # nothing), and is named in neither the targets nor what to kill.
    s = Session(["sh", "-c"], script="sleep 61 & sleep 60; :")
    try:
        (sibling,) = s.others
        log = fake_docker(tmp_path, s.main)
        out = act(tmp_path, s, [s.job])
        assert rec(out, "left-to-signal") == f"{s.root} {s.job}"
        assert rec(out, "first") == str(s.root)
        assert rec(out, "matched") == "2"
        assert f"\tmatch\t1\t{sibling}\t" not in out
        assert rec(act(tmp_path, s, [s.job], check=True), "left-to-signal") == (
            f"{s.root} {s.job}")
        (refusal,) = parse_script_output(act(tmp_path, s, [s.job], "refuse"), "", 0).refused
        assert refusal.fix == f"kill {s.root} {s.job}"
        assert not [c for c in log.read_text().splitlines() if not c.startswith("inspect ")]
        assert comm(sibling) == "sleep"
    finally:
        s.close()


def test_a_job_its_exec_sessions_end_left_to_the_main_process_is_no_cause_to_stop_it(
    tmp_path: Path, session: Session
) -> None:
    # Its exec session ended by one stage (its root SIGKILLed), a job stuck in D is the
    # container's main process's child at the next: it was exec'd all the same
    # (FC_EXEC_SEEN), and the container (its other exec sessions) is not stopped for it.
    log = fake_docker(tmp_path, session.main)
    adopted = (f"FC_PPID[{session.job}]={session.main}\n"
               f"FC_TARGETS=({session.job}) FC_MATCHED=1\n"
               "fc_owner_act TERM 100 100\n"
               'fc_rec again "${FC_TARGETS[*]}|${FC_EXEC_FIRST[*]}|$FC_OWNER_SAID"\n')
    out = act(tmp_path, session, [session.job], after=adopted)
    assert rec(out, "left-to-signal") == f"{session.root} {session.job}"
    assert rec(out, "again") == (
        f"{session.job}||not stopped: docker {CID[:12]} (pid {session.job} started by docker "
        f"exec, not by its main process {session.main}); ")
    assert not [c for c in log.read_text().splitlines() if not c.startswith("inspect ")]
    assert session.main_proc.poll() is None
