"""Acting through a Podman container's owner (``owner-act.sh``) with a fake ``podman``,
``systemctl`` and ``runuser`` on an empty PATH (item 65, its review): the unit a container's
PODMAN_SYSTEMD_UNIT label names, a unit whose MainPID is the container's conmon, a user's
podman whose answer is not of that user's container, ``podman exec`` jobs, ``--pid=host``,
a podman that hangs, a container that does not run, and the user's podman's environment.

Nothing is signalled but a ``sleep`` each test starts itself; only ``fc_owner_act``'s
choice (and what it asked the fakes) is looked at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fleetclean.engine.stages import template
from fleetclean.results.parse import parse_script_output

CID = "9c1d7e3b5a2f4e6081c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1e3f5a7"
NOBODY = 65534  # an account of this machine's, for a rootless user's podman

# $1 the target, $2 the setup (bash: FC_OK/FC_OI/FC_OU, fake process table entries).
DRIVER = r"""
fc_rec begin 1 p h 0
fc_self_init
pid=$1 FC_IDX=1
fc_proc_load "$pid"
FC_PIDS=("$pid")
FC_OWNER_ACT=([systemd]=stop [docker]=stop [podman]=${FC_TEST_PODMAN:-stop} [plain]=signal)
FC_TARGETS=("$pid")
eval "$2"
PATH=$3
fc_owner_act TERM 100 100
fc_rec left-to-signal "${FC_TARGETS[*]}"
fc_rec said "$FC_OWNER_SAID"
fc_rec exec "${FC_OWNER_EXEC[$pid]:-}"
fc_holds_gpu() { return 0; }  # the holder's /dev/nvidiaN, which this machine has none of
fc_note_respawn_risk "$pid"
fc_rec watched "${!FC_WATCH_OWNER[*]}"
fc_rec owner-now "${FC_OK[$pid]} ${FC_OI[$pid]}"
fc_rec done 0
"""


def fake(tmp_path: Path, name: str, body: str) -> Path:
    """A fake tool on the test's PATH that logs its argv to NAME.log, then runs BODY."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path}/{name}.log\n{body}\n')
    path.chmod(0o755)
    return path


def podman_answers(tmp_path: Path, answer: str, *, hang: bool = False) -> None:
    """``podman inspect`` prints ANSWER (podman's words for the format it was given); stop
    and kill succeed. A runuser that runs the fake podman (never this machine's)."""
    inspect = "exec /bin/sleep 60" if hang else f"echo '{answer}'"
    fake(tmp_path, "podman", f'case "$1" in inspect) {inspect};; esac\nexit 0')
    fake(tmp_path, "runuser", f'while [ "$1" != podman ]; do shift; done; shift\n'
                              f'exec {tmp_path}/podman "$@"')
    for tool in ("env", "timeout", "stat", "getent"):
        found = shutil.which(tool)
        assert found, tool
        (tmp_path / tool).symlink_to(found)


def systemctl_main(tmp_path: Path, main: int) -> None:
    """A systemctl whose units have MAIN for their MainPID; stop succeeds."""
    fake(tmp_path, "systemctl", f'case "$*" in *MainPID*) echo {main};; esac\nexit 0')


def act(tmp_path: Path, pid: int, setup: str, podman: str = "stop") -> dict[str, str]:
    script = "".join(template(t) for t in ("lib.sh", "lib-kill.sh", "owner.sh",
                                           "owner-act.sh")) + DRIVER
    (tmp_path / "act.sh").write_text(script)  # a file: 128 KiB is too long for `bash -c`
    env = {**os.environ, "FC_RUN_USER": str(tmp_path / "run" / "user"),
           "FC_TEST_PODMAN": podman}
    if (tmp_path / "proc").is_dir():
        env["FC_PROC"] = str(tmp_path / "proc")
    done = subprocess.run(["bash", str(tmp_path / "act.sh"), str(pid), setup, str(tmp_path)],
                          capture_output=True, text=True, check=False, timeout=60, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        words = line.split("\t")
        if len(words) >= 3 and words[1] in ("left-to-signal", "said", "exec", "watched",
                                            "owner-now"):
            rows[words[1]] = words[2]
    rows["warn"] = "; ".join(parse_script_output(done.stdout, "", 0).warnings)
    rows["owners"] = "; ".join(f"{w[2]} {w[3]} {w[4]}" for w in
                               (ln.split("\t") for ln in done.stdout.splitlines())
                               if len(w) >= 5 and w[1] == "owner")
    for tool in ("podman", "systemctl", "runuser"):
        log = tmp_path / f"{tool}.log"
        rows[tool] = log.read_text() if log.exists() else ""
    return rows


def rootful(pid: int, conmon: int = 0) -> str:
    setup = f"FC_OK[{pid}]=podman FC_OI[{pid}]={CID} FC_ON[{pid}]={CID[:12]}\n"
    if conmon:
        setup += f"FC_PPID[{pid}]={conmon} FC_COMM[{conmon}]=conmon FC_START[{conmon}]=1\n"
    return setup


def test_a_container_a_unit_runs_is_stopped_through_that_unit(
    tmp_path: Path, sleeper: int
) -> None:
    # Its conmon may be anywhere (podman-restart.service's cgroup, its own scope): the
    # PODMAN_SYSTEMD_UNIT label, in podman's one answer, names the unit (Quadlet,
    # `podman generate systemd`), whose MainPID is the conmon: the unit is stopped, or
    # systemd would start the container again.
    conmon = os.getpid()
    podman_answers(tmp_path, f"{sleeper}|{conmon}|private|vllm.service|")
    systemctl_main(tmp_path, conmon)
    rows = act(tmp_path, sleeper, rootful(sleeper, conmon))
    assert rows["left-to-signal"] == ""
    assert "stop --no-block vllm.service" in rows["systemctl"]
    assert "stop" not in rows["podman"].replace("inspect", "")
    assert rows["owner-now"] == "systemd vllm.service"
    assert rows["owners"] == f"{sleeper} systemd vllm.service"


def test_a_container_without_a_unit_label_is_stopped_through_podman(
    tmp_path: Path, sleeper: int
) -> None:
    # Brought back at boot by podman-restart.service (its conmon left in that unit's
    # cgroup): podman's own, `podman stop`; never `systemctl stop podman-restart.service`.
    podman_answers(tmp_path, f"{sleeper}|{os.getpid()}|private||")
    systemctl_main(tmp_path, 0)
    rows = act(tmp_path, sleeper, rootful(sleeper, os.getpid()))
    assert rows["left-to-signal"] == ""
    assert f"stop -t 1 {CID}" in rows["podman"]
    assert rows["systemctl"] == ""
    assert rows["said"] == f"stopped podman {CID[:12]}; "


@pytest.mark.parametrize("conmon_is_main", [True, False])
def test_a_unit_whose_main_process_is_the_containers_conmon_is_stopped(
    tmp_path: Path, sleeper: int, conmon_is_main: bool
) -> None:
    # Quadlet (--cgroups=split, --sdnotify=conmon): the container in the unit's cgroup,
    # the unit's MainPID its conmon, the target's parent. Another conmon (a podman exec
    # session's) as MainPID is no sign.
    conmon = os.getpid()
    systemctl_main(tmp_path, conmon if conmon_is_main else 4194001)
    setup = (f"FC_OK[{sleeper}]=systemd FC_OI[{sleeper}]=vllm.service "
             f"FC_ON[{sleeper}]=vllm.service\nFC_PPID[{sleeper}]={conmon} "
             f"FC_COMM[{conmon}]=conmon FC_START[{conmon}]=1 FC_COMM[4194001]=conmon\n")
    rows = act(tmp_path, sleeper, setup)
    if conmon_is_main:
        assert rows["left-to-signal"] == ""
        assert "stop --no-block vllm.service" in rows["systemctl"]
    else:
        assert rows["left-to-signal"] == str(sleeper)
        assert "stop" not in rows["systemctl"].replace("show", "")


def users_podman(tmp_path: Path, main: int, cgroup: str) -> None:
    """NOBODY's runtime dir, and the cgroup file of MAIN; the setup of a target of
    NOBODY's rootless container."""
    run = tmp_path / "run" / "user" / str(NOBODY)
    run.mkdir(parents=True)
    os.chown(run, NOBODY, -1)
    (tmp_path / "proc" / str(main)).mkdir(parents=True)
    (tmp_path / "proc" / str(main) / "cgroup").write_text(cgroup)


@pytest.mark.skipif(os.geteuid() != 0, reason="runuser: root's")
@pytest.mark.parametrize("ours", [True, False])
def test_a_users_podman_is_believed_only_for_a_main_process_in_that_users_container(
    tmp_path: Path, sleeper: int, ours: bool
) -> None:
    # The user's podman reads the user's own storage, which may name any process: root's
    # container's main process, say. Its answer holds only where that process is in the
    # container's scope under that user's manager. The user's podman is run with none of
    # root's environment.
    # (Its main process, 4194002, a fake one's: the target runs under it.)
    main = 4194002
    user = f"0::/user.slice/user-{NOBODY}.slice/user@{NOBODY}.service/user.slice"
    users_podman(tmp_path, main, f"{user}/libpod-{CID}.scope\n" if ours
                 else f"0::/machine.slice/libpod-{CID}.scope/container\n")
    podman_answers(tmp_path, f"{main}|0|private||")
    setup = (rootful(sleeper) + f"FC_OU[{sleeper}]={NOBODY} FC_PPID[{sleeper}]={main} "
             f"FC_START[{main}]=1 FC_PPID[{main}]=1\n")
    rows = act(tmp_path, sleeper, setup)
    assert rows["runuser"].startswith(
        f"-u nobody -- env -i HOME=/nonexistent USER=nobody LOGNAME=nobody PATH=/usr/local/sbin:"
        f"/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin XDG_RUNTIME_DIR={tmp_path}/run/user/"
        f"{NOBODY} podman inspect")
    if ours:
        assert rows["left-to-signal"] == ""
        assert f"stop -t 1 {CID}" in rows["podman"]
    else:
        assert rows["left-to-signal"] == str(sleeper)
        assert "stop" not in rows["podman"].replace("inspect", "")
        assert (f"its podman named pid {main} as its main process, which is not in the "
                "container's cgroup") in rows["warn"]


def act_on_an_exec_job(tmp_path: Path, sleeper: int, podman: str = "stop") -> dict[str, str]:
    """``act`` on SLEEPER as a job ``podman exec`` started: its parent this process (its
    exec session's conmon), the container's main process 4194002 under conmon 4194003."""
    main = 4194002
    podman_answers(tmp_path, f"{main}|4194003|private||")
    setup = rootful(sleeper, os.getpid()) + f"FC_START[{main}]=1 FC_PPID[{main}]=4194003\n"
    return act(tmp_path, sleeper, setup, podman=podman)


def test_a_job_podman_exec_started_is_signalled_and_its_container_not_watched(
    tmp_path: Path, sleeper: int
) -> None:
    # Its parent is its exec session's own conmon, not the main process's: signalled alone,
    # and no new process elsewhere in the container (a healthcheck's exec) reads as a
    # respawn: the container is not watched, nor is the job (its conmon starts nothing).
    main, exec_conmon = 4194002, os.getpid()
    rows = act_on_an_exec_job(tmp_path, sleeper)
    assert rows["left-to-signal"] == str(sleeper)
    assert rows["exec"] == f"{main} {exec_conmon}"
    assert rows["watched"] == ""
    assert "stop" not in rows["podman"].replace("inspect", "")
    assert f"started by podman exec, not by its main process {main}" in rows["said"]


def test_under_owner_podman_signal_a_podman_exec_job_is_not_watched_as_its_container(
    tmp_path: Path, sleeper: int
) -> None:
    rows = act_on_an_exec_job(tmp_path, sleeper, podman="signal")
    assert rows["left-to-signal"] == str(sleeper)
    assert rows["watched"] == ""


def test_a_container_in_the_hosts_pid_namespace_is_stopped_whatever_its_main_process(
    tmp_path: Path, sleeper: int
) -> None:
    # --pid=host: conmon (a subreaper) adopts what the main process double-forked, which
    # then looks started by podman exec; the main process may start it again.
    podman_answers(tmp_path, "4194002|4194003|host||")
    rows = act(tmp_path, sleeper, rootful(sleeper, os.getpid()))
    assert rows["left-to-signal"] == ""
    assert f"stop -t 1 {CID}" in rows["podman"]


def test_a_hung_podman_is_waited_for_once(tmp_path: Path, sleeper: int) -> None:
    # Two containers of one podman that does not answer: one 10 s wait, not two.
    podman_answers(tmp_path, "", hang=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        setup = (rootful(sleeper) + f"FC_OK[{other.pid}]=podman FC_OI[{other.pid}]={'ab' * 32}\n"
                 f"FC_TARGETS+=({other.pid}) FC_PIDS+=({other.pid}); fc_proc_load {other.pid}\n")
        t0 = time.monotonic()
        rows = act(tmp_path, sleeper, setup)
        took = time.monotonic() - t0
    finally:
        other.kill()
        other.wait()
    assert sorted(rows["left-to-signal"].split()) == sorted([str(sleeper), str(other.pid)])
    assert rows["podman"].count("inspect") == 1
    assert took < 18, took
    assert "no answer in 10 s" in rows["warn"]


def test_a_container_that_does_not_run_is_not_stopped(tmp_path: Path, sleeper: int) -> None:
    # `podman stop` would mark it stopped by the user: an unless-stopped container would
    # stay down at the next boot.
    podman_answers(tmp_path, "0|0|private||")
    rows = act(tmp_path, sleeper, rootful(sleeper))
    assert rows["left-to-signal"] == str(sleeper)
    assert "stop" not in rows["podman"].replace("inspect", "")
    assert rows["said"] == f"not stopped: podman {CID[:12]} (not running); "
