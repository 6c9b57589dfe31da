"""Acting through the owner (``owner-act.sh``) where no supervisor can be reached, and the
``owner_*`` variables as bad input.

The bash runs with an empty PATH: no systemctl, docker or crictl can be found (this
machine has real ones, which a test must never reach), and nothing is signalled: only
``fc_owner_act``'s choice is looked at, for a ``sleep`` this test started itself.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.engine.stages import template
from fleetclean.results.parse import parse_script_output

DRIVER = r"""
fc_rec begin 1 p h 0
fc_self_init
pid=$1 FC_IDX=1
fc_proc_load "$pid"  # the one process of the table it needs: a scan of this machine is slow
FC_PIDS=("$pid")
if [[ -n $6 ]]; then  # the job's step, as slurmstepd titles itself on a node
    FC_PIDS+=(4194000) FC_CMD[4194000]="slurmstepd: [$6]"
fi
FC_OWNER_ACT=([systemd]=stop [docker]=stop [slurm]=${FC_TEST_SLURM:-refuse} [kubernetes]=refuse
    [plain]=signal)
FC_OK[$pid]=$2 FC_OI[$pid]=$3 FC_ON[$pid]=$4
[[ -n $7 ]] && FC_DOCKER_UID[$3]=$7  # a rootless container: its cgroup under user@UID
FC_TARGETS=("$pid")
PATH=$5
fc_owner_act TERM 100 100
fc_rec left-to-signal "${FC_TARGETS[*]}"
fc_rec said "$FC_OWNER_SAID"
fc_rec watched "$FC_RESPAWN_RISK ${!FC_WATCH_OWNER[*]}"
fc_rec done 0
"""


# What the stage asks docker of a container (as the fake logs its argv, words joined).
INSPECT = "{{.State.Pid}} {{.HostConfig.PidMode}}"


def act(tmp_path: Path, pid: int, kind: str, oid: str, name: str, *,
        step: str = "", rootless: str = "", slurm: str = "refuse") -> tuple[str, str]:
    script = "".join(template(t) for t in ("lib.sh", "lib-kill.sh", "owner.sh",
                                           "owner-act.sh", "owner-slurm.sh")) + DRIVER
    # A rootless daemon's socket and its container's cgroups, where a test made them
    # (user_daemon): under tmp_path, never this machine's /run/user or /proc.
    env = {**os.environ, "FC_RUN_USER": str(tmp_path / "run" / "user"), "FC_TEST_SLURM": slurm}
    if (tmp_path / "proc").is_dir():
        env["FC_PROC"] = str(tmp_path / "proc")
    # A file, not a `bash -c` string: the libraries with their comments pass the kernel's
    # limit on one argument (128 KiB), as in test_owner_exec.
    (tmp_path / "act.sh").write_text(script)
    done = subprocess.run(["bash", str(tmp_path / "act.sh"), str(pid), kind, oid, name,
                           str(tmp_path), step, rootless], capture_output=True, text=True,
                          check=False, timeout=30, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    warnings = parse_script_output(done.stdout, "", 0).warnings
    return done.stdout, warnings[0] if warnings else ""


def tools(tmp_path: Path, *names: str) -> None:
    """This machine's ``names`` on the empty PATH of ``act`` (tmp_path)."""
    for tool in names:
        found = shutil.which(tool)
        assert found, tool
        (tmp_path / tool).symlink_to(found)


def user_daemon(tmp_path: Path, uid: int, *, owner: int | None = None, link: bool = False,
                main: int = 0, cgroup_of_main: str = "") -> str:
    """A rootless daemon's socket of user ``uid`` (owned by ``owner``, uid by default; a
    link to a socket elsewhere with ``link``), and the cgroup file of pid ``main`` (the
    container 3f..3f's under uid's manager by default): its -H words."""
    home = tmp_path / "run" / "user" / str(uid)
    home.mkdir(parents=True)
    sock = home / "docker.sock"
    target = tmp_path / "elsewhere.sock" if link else sock
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(target))
    os.chown(target, uid if owner is None else owner, -1)
    if link:
        sock.symlink_to(target)
    if main:
        (tmp_path / "proc" / str(main)).mkdir(parents=True)
        (tmp_path / "proc" / str(main) / "cgroup").write_text(cgroup_of_main or (
            f"0::/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/"
            f"docker-{'3f' * 32}.scope\n"))
    tools(tmp_path, "stat")
    return f"-H unix://{sock}"


def test_no_systemctl_signals_the_unit_and_warns_it_may_restart(
    tmp_path: Path, sleeper: int
) -> None:
    out, warning = act(tmp_path, sleeper, "systemd", "trainer.service", "trainer.service")
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    assert warning == ("no systemctl on the node: trainer.service's processes were "
                       "signalled; the unit may restart them")


def test_no_docker_cli_signals_the_container_and_warns(tmp_path: Path, sleeper: int) -> None:
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    assert warning.startswith("no docker CLI on the node: container 3f3f3f3f3f3f's")


def test_a_failed_docker_stop_is_said_not_taken_for_a_stop(tmp_path: Path, sleeper: int) -> None:
    # A docker whose stop fails (its daemon refused it): the container was reported
    # "stopped", its process then killed with no word that its restart policy may bring it
    # back. The process is this test's own sleep.
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Error response from daemon: conflict' >&2\nexit 1\n")
    fake.chmod(0o755)
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
    assert warning.startswith("docker stop 3f3f3f3f3f3f failed (exit 1)"), (warning, out)
    assert "stopped docker" not in out
    # Killed after the grace, as a signalled container is: watched as one for a respawn.
    assert f"\twatched\t1 docker {'3f' * 32}\n" in out


def test_a_rootless_container_is_stopped_through_its_users_daemon(
    tmp_path: Path, sleeper: int
) -> None:
    # Its cgroup is under user@2602.service: the user's rootless daemon runs it, on
    # /run/user/2602/docker.sock. Root's daemon (the CLI's default) knows nothing of it:
    # asked there, the stop failed, and the user's daemon started the killed container
    # again by its restart policy.
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n"
                    f"case $3 in inspect) echo {os.getpid()} ;; stop) kill {sleeper} ;; esac\n")
    fake.chmod(0o755)
    host = user_daemon(tmp_path, 2602, main=os.getpid())
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6, rootless="2602")
    calls = log.read_text().splitlines()
    assert calls[0] == f"{host} inspect -f {INSPECT} {'3f' * 32}", calls
    assert calls[1] == f"{host} stop -t 1 {'3f' * 32}" and warning == "", (calls, warning)
    assert "stopped docker 3f3f3f3f3f3f (rootless, uid 2602); " in out
    assert "\twatched\t0 \n" in out


def test_a_rootless_container_whose_daemon_does_not_answer_is_signalled_and_said(
    tmp_path: Path, sleeper: int
) -> None:
    # No daemon on the user's socket: no stop can work. Its processes are signalled (and
    # watched for a respawn as any signalled container's), and the warning names the
    # daemon and what to run.
    host = user_daemon(tmp_path, 2602)
    sock = host.removeprefix("-H ")
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho 'Cannot connect to the Docker daemon at {sock}. Is the "
                    "docker daemon running?' >&2\nexit 1\n")
    fake.chmod(0o755)
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6, rootless="2602")
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    assert warning == (
        f"docker 3f3f3f3f3f3f (rootless, uid 2602): its daemon at {sock} did not answer for "
        f"it (Cannot connect to the Docker daemon at {sock}. Is the docker daemon running?): "
        "its processes were signalled; its restart policy may start them again; to stop it: "
        f"docker {host} stop 3f3f3f3f3f3f")


@pytest.mark.parametrize("case", ["link", "root's socket", "main elsewhere"])
def test_a_users_socket_that_is_not_that_users_daemon_is_never_asked_to_stop(
    tmp_path: Path, sleeper: int, case: str
) -> None:
    # The user makes the cgroup (a scope named after a root container's ID) and whatever
    # sits at /run/user/UID/docker.sock: a link to root's socket, or a daemon of theirs
    # naming that container's main process, would have had root's daemon stop root's
    # container. Such a container's processes are signalled, and it is said.
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n"
                    f"case $3 in inspect) echo {os.getpid()} host ;; esac\n")
    fake.chmod(0o755)
    host = user_daemon(tmp_path, 2602, link=case == "link", main=os.getpid(),
                       owner=0 if case == "root's socket" else None,
                       cgroup_of_main=("0::/system.slice/docker-" + "3f" * 32 + ".scope\n"
                                       if case == "main elsewhere" else ""))
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6, rootless="2602")
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    calls = log.read_text().splitlines() if log.exists() else []
    assert not [c for c in calls if " stop " in c or " kill " in c], calls
    sock = host.removeprefix("-H unix://")
    why = {"link": f"no socket of its own at {sock}",
           "root's socket": f"{sock} belongs to uid 0, not 2602",
           "main elsewhere": f"it named pid {os.getpid()} as its main process, which is not "
                             "in the container's cgroup"}[case]
    assert f"did not answer for it ({why}): its processes were signalled" in warning


def test_a_docker_stop_that_ends_after_its_container_is_still_a_stop(
    tmp_path: Path, sleeper: int
) -> None:
    # The container's process went first and the client answered 1 s later: ended by a
    # TERM at once, it read as a failed stop (exit 143).
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = stop ] && kill {sleeper}; /bin/sleep 1; exit 0\n")
    fake.chmod(0o755)
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
    assert warning == "", warning
    assert "stopped docker 3f3f3f3f3f3f" in out


@pytest.mark.parametrize("mode", ["host", "container:" + "5e" * 32])
def test_a_container_in_the_hosts_pid_namespace_is_stopped_whatever_its_main_process(
    tmp_path: Path, sleeper: int, mode: str
) -> None:
    # --pid=host: no init of its own adopts what the main process double-forked, the shim
    # (a subreaper) does, so such a child looks like an exec'd job; the main process may
    # run it again. The container is stopped, as before docker exec was told apart. So with
    # --pid=container:ID, whose orphans another container's init adopts.
    with subprocess.Popen(["sleep", "60"]) as other:
        log = tmp_path / "docker.log"
        fake = tmp_path / "docker"
        fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n"
                        f"case $1$3 in inspect*PidMode*) echo {other.pid} {mode} ;; "
                        f"inspect*) echo {other.pid} ;; stop*) kill {sleeper} ;; esac\n")
        fake.chmod(0o755)
        try:
            out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
        finally:
            other.kill()
    assert warning == "" and "stopped docker 3f3f3f3f3f3f" in out, (out, warning)
    assert log.read_text().splitlines()[1].startswith("stop -t 1 ")


def test_a_docker_daemon_that_does_not_answer_leaves_the_container_signalled_and_said(
    tmp_path: Path, sleeper: int
) -> None:
    # A hung dockerd: its inspect is cut at 10 s, and no stop is tried (it would hang as
    # long again); the container's processes are left to the stage's signals (which watch
    # them for a respawn), and it is said.
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\nexec sleep 60\n")
    fake.chmod(0o755)
    tools(tmp_path, "timeout", "sleep")
    out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
    assert f"\tleft-to-signal\t{sleeper}\n" in out and len(log.read_text().splitlines()) == 1
    assert warning == (
        "docker 3f3f3f3f3f3f: its daemon did not answer for it (no answer in 10 s): its "
        "processes were signalled; its restart policy may start them again; to stop it: "
        "docker stop 3f3f3f3f3f3f")


@pytest.mark.parametrize("under_main", [True, False])
def test_a_container_is_stopped_only_for_its_main_process_or_what_runs_under_it(
    tmp_path: Path, sleeper: int, under_main: bool
) -> None:
    # docker inspect names the container's main process: this test (the sleep's parent),
    # or a process beside the sleep (as one `docker exec` started is beside the main
    # process, both children of the containerd-shim). Beside it, `docker stop` would take
    # down the user's whole container for it: the sleep is left to be signalled by PID.
    with subprocess.Popen(["sleep", "60"]) as other:
        main = os.getpid() if under_main else other.pid
        log = tmp_path / "docker.log"
        fake = tmp_path / "docker"
        fake.write_text(f"#!/bin/sh\necho \"$*\" >>{log}\n"
                        f"case $1 in inspect) echo {main} ;; stop) kill {sleeper} ;; esac\n")
        fake.chmod(0o755)
        try:
            out, warning = act(tmp_path, sleeper, "docker", "3f" * 32, "3f" * 6)
        finally:
            other.kill()
    calls = log.read_text().splitlines()
    assert calls[0] == f"inspect -f {INSPECT} {'3f' * 32}" and warning == ""
    if under_main:
        assert "stopped docker 3f3f3f3f3f3f" in out and calls[1].startswith("stop -t 1 ")
    else:
        assert f"\tleft-to-signal\t{sleeper}\n" in out and len(calls) == 1
        assert (f"not stopped: docker 3f3f3f3f3f3f (pid {sleeper} started by docker exec, "
                f"not by its main process {main}); ") in out


def test_infrastructure_units_are_never_stopped(tmp_path: Path, sleeper: int) -> None:
    # Without pam_systemd a login's processes live in ssh.service: signalled one by one.
    out, warning = act(tmp_path, sleeper, "systemd", "ssh.service", "ssh.service")
    assert f"\tleft-to-signal\t{sleeper}\n" in out and warning == ""


def test_a_slurm_job_is_refused_without_a_signal(tmp_path: Path, sleeper: int) -> None:
    out, _ = act(tmp_path, sleeper, "slurm", "4242", "4242.0", step="4242.0")
    report = parse_script_output(out, "", 0)
    (refusal,) = report.refused
    assert (refusal.pid, refusal.fix) == (sleeper, "scancel 4242")
    assert refusal.who.startswith("Slurm job 4242 (user ")
    assert "\tleft-to-signal\t\n" in out and report.signalled == ()


def test_a_finished_jobs_orphan_is_signalled(tmp_path: Path, sleeper: int) -> None:
    # Its job's cgroup still holds it (proctrack/linuxproc), but no step of the job runs on
    # the node any more: nobody's running job, so a process like any other.
    out, _ = act(tmp_path, sleeper, "slurm", "4242", "4242.0")
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    assert parse_script_output(out, "", 0).refused == ()


def test_owner_slurm_stop_without_scancel_signals_the_task_and_says_so(
    tmp_path: Path, sleeper: int
) -> None:
    out, warning = act(tmp_path, sleeper, "slurm", "4242", "4242.0", step="4242.0",
                       slurm="stop")
    assert f"\tleft-to-signal\t{sleeper}\n" in out
    assert warning == ("no scancel on the node: Slurm job 4242's processes were signalled; "
                       "the job may start more; to end it: scancel 4242")


def test_a_scancel_slurmctld_refuses_is_said_and_the_task_signalled(
    tmp_path: Path, sleeper: int
) -> None:
    # scancel's own words, as a user who may not cancel another's job gets them; exit 0
    # with an error on some Slurm versions: a failure either way, never "cancelled".
    for status in (1, 0):
        fake = tmp_path / "scancel"
        fake.write_text("#!/bin/sh\necho 'scancel: error: Kill job error on job id 4242: "
                        f"Access/permission denied' >&2\nexit {status}\n")
        fake.chmod(0o755)
        out, warning = act(tmp_path, sleeper, "slurm", "4242", "4242.0", step="4242.0",
                           slurm="stop")
        assert warning == ("scancel 4242 failed (scancel: error: Kill job error on job id "
                           "4242: Access/permission denied): its processes were signalled; "
                           "the job may start more"), out
        assert f"\tleft-to-signal\t{sleeper}\n" in out and "cancelled" not in out


def test_a_pod_without_crictl_is_named_by_its_uid(tmp_path: Path, sleeper: int) -> None:
    out, _ = act(tmp_path, sleeper, "kubernetes", "0d3c1b2a-0000-4000-8000-00000000abcd",
                 "ab" * 32)
    (refusal,) = parse_script_output(out, "", 0).refused
    assert refusal.who == "pod with UID 0d3c1b2a-0000-4000-8000-00000000abcd"


@pytest.mark.parametrize(("item", "words"), [
    ("owner_kubernetes=stop", "owner_kubernetes must be one of refuse, signal, not 'stop'"),
    ("owner_slurm=halt", "owner_slurm must be one of refuse, signal, stop, not 'halt'"),
    ("owner_docker=halt", "owner_docker must be one of stop, signal, refuse, not 'halt'"),
    ("never_stop_units=a;b", "never_stop_units: 'a;b' is not a unit name"),
])
def test_a_bad_owner_variable_is_bad_input(cli: Cli, item: str, words: str) -> None:
    done = cli("run", "post-extraction", "-i", "gpu01,", "-e", item)
    assert done.code == 4
    assert words in done.err and len(done.err.strip().splitlines()) == 1


def test_a_bad_owner_variable_in_a_playbook_names_its_line(cli: Cli, tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text("name: b\ndescription: d\nvars:\n  grace: 1\n  owner_kubernetes: stop\n"
                    "stages:\n  - {name: s, type: signal, pattern: sglang}\n")
    done = cli("run", book, "-i", "gpu01,")
    assert done.code == 4
    assert f"{book}:5:" in done.err and "owner_kubernetes must be one of" in done.err


WATCH = r"""
fc_proc_load "$1"
FC_PIDS=("$1")
fc_holds_gpu() { return 0; }  # the holder's /dev/nvidiaN, which this machine has none of
FC_OK[$1]=$2 FC_OI[$1]=$3 FC_PPID[$1]=$4
if [[ $2 == rootless ]]; then  # a rootless container: its user's daemon runs it
    FC_OK[$1]=docker FC_DOCKER_UID[$3]=2602
fi
[[ -n $5 ]] && FC_OWNER_EXEC[$1]=$5  # started by docker exec: "MAIN SHIM"
fc_note_respawn_risk "$1"
printf '%s %s\n' "$FC_RESPAWN_RISK" "${!FC_WATCH_OWNER[*]}"
"""


@pytest.mark.parametrize(("kind", "oid", "parent", "want"), [
    ("plain", "", "1", "0 "),  # an orphan: init reaps it, nothing restarts it, no settle
    ("plain", "", "PARENT", "1 "),  # its parent lives on and may start it again
    ("tmux", "31", "1", "0 "),
    ("docker", "3f" * 32, "1", f"1 docker {'3f' * 32}"),  # watched in its container
    ("rootless", "3f" * 32, "1", f"1 docker {'3f' * 32}"),  # a rootless one's the same
    ("systemd", "vllm.service", "1", "1 systemd vllm.service"),
])
def test_the_respawn_watch_follows_the_owner(sleeper: int, kind: str, oid: str, parent: str,
                                             want: str) -> None:
    assert watch(sleeper, kind, oid, parent) == want


@pytest.mark.parametrize(("parent", "want"), [("77", "0 "), ("PARENT", "1 ")])
def test_a_process_docker_exec_started_is_watched_through_its_parent_but_the_shim(
    sleeper: int, parent: str, want: str
) -> None:
    # Neither docker nor the containerd-shim (77), its parent, starts it again: no settle,
    # no container watched. A shell that docker exec ran (and may run it in a loop) is a
    # parent like any other.
    assert watch(sleeper, "docker", "3f" * 32, parent, execd="812 77") == want


def watch(pid: int, kind: str, oid: str, parent: str, execd: str = "") -> str:
    """What fc_note_respawn_risk notes for signalled holder PID: FC_RESPAWN_RISK and the
    owners watched."""
    parent = str(os.getpid()) if parent == "PARENT" else parent
    script = "".join(template(t) for t in ("lib.sh", "lib-kill.sh", "owner.sh",
                                           "owner-act.sh")) + WATCH
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:  # a file: see act()
        f.write(script)
        f.flush()
        done = subprocess.run(["bash", f.name, str(pid), kind, oid, parent, execd],
                              capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.removesuffix("\n")


def test_an_array_tasks_cancel_names_the_task_not_its_array(tmp_path: Path) -> None:
    # One task of every array has the array's id for its job id: `scancel ID` of it ended
    # every task of the array, pending ones too. Its own ARRAY_TASK is what is cancelled.
    env = {**os.environ, "SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40",
           "SLURM_ARRAY_TASK_ID": "2"}
    task = subprocess.Popen(["sleep", "60"], env=env)
    plain = subprocess.Popen(["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": "41"})
    try:
        script = "".join(template(t) for t in ("lib.sh", "owner.sh", "owner-act.sh",
                                               "owner-slurm.sh"))
        script += ('fc_slurm_how 40 "$1" && echo "$FC_SLURM_REF ${#FC_SLURM_AS[@]}"\n'
                   'fc_slurm_how 41 "$2" && echo "$FC_SLURM_REF"\n')
        (tmp_path / "how.sh").write_text(script)
        done = subprocess.run(["bash", str(tmp_path / "how.sh"), str(task.pid), str(plain.pid)],
                              capture_output=True, text=True, check=False, timeout=30)
        # As root, a root process's job is cancelled by root itself (no runuser).
        assert done.stdout.splitlines() == ["40_2 0", "41"], done.stderr
    finally:
        for proc in (task, plain):
            proc.kill()
            proc.wait()


def test_a_host_whose_group_stops_slurm_jobs_gets_the_code_for_it() -> None:
    # The renderer shared one library between hosts of the same stage types: a host with
    # owner_slurm=stop after one with refuse got a script without owner-slurm.sh, and its
    # job's tasks were signalled behind Slurm's back.
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.render import Renderer
    from fleetclean.engine.variables import resolve

    book = load_playbook("post-extraction")
    renderer = Renderer()
    refuse = renderer.pieces(resolve(book, {}, {}), host_name="gpu01")
    stop = renderer.pieces(resolve(book, {"owner_slurm": "stop"}, {}), host_name="gpu02")
    assert "fc_slurm_can_cancel() {" not in "".join(refuse)
    assert "fc_slurm_can_cancel() {" in "".join(stop)
