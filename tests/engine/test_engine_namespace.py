"""Rendered scripts executed with ``bash -s`` inside a PID + mount namespace of their own.

Every workload is started inside the namespace by ``setup`` and dies with it; /tmp,
/run and /dev are private tmpfs mounts there, so nothing can touch the host. The
namespace's setup shell has "sglang" in its own argv: the seeds' failure is always present.
"""

from __future__ import annotations

from typing import Any

import pytest
from nsrun import namespace_available, run_in_namespace

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import render_script
from fleetclean.engine.variables import resolve

pytestmark = [pytest.mark.sim,
              pytest.mark.skipif(not namespace_available(), reason="needs Linux, root, unshare")]

SGLANG = ("spawn srv --setsid --hold /dev/nvidia0 --hold /dev/nvidia1 "
          "--worker sglang::scheduler_TP0 --worker sglang::scheduler_TP1 "
          "--orphan orphan-helper python3 -m sglang.launch_server --tp 8\n")
STUBBORN = "spawn stub --setsid --term ignore --hold /dev/nvidia2 stubborn-holder\n"
SLOW = "spawn slow --setsid --term slow --hold /dev/nvidia3 slow-holder\n"
BYSTANDERS = (
    # An NVML user: every GPU's file open, no CUDA context, no memory.
    "spawn mon --setsid --nvml --hold /dev/nvidiactl "
    + "".join(f"--hold /dev/nvidia{i} " for i in range(8)) + "python3-monitor-agent\n"
    # argv[0] is nvidia-persistenced: protected by name even though it holds a GPU file.
    'READY+=(/tmp/ready.pers); (exec -a nvidia-persistenced "$FC_PY" "$FC_WORKLOAD" '
    "--ready /tmp/ready.pers --setsid --hold /dev/nvidiactl --hold /dev/nvidia4 "
    "</dev/null >/dev/null 2>&1) &\n")


def script(name: str, extra: dict[str, Any] | None = None, **kw: Any) -> str:
    pb = load_playbook(name)
    return render_script(resolve(pb, {}, extra or {}), host_name="ns", **kw)


def after(r: Any) -> str:
    """What the test's `after` commands printed."""
    return str(r.stdout.partition("__RC__=")[2].partition("__PS__")[0].partition("\n")[2])


def playbook_file(tmp_path: Any, text: str) -> str:
    p = tmp_path / "pb.yaml"
    p.write_text(text)
    return str(p)


def test_post_extraction_frees_every_gpu_and_spares_bystanders() -> None:
    r = run_in_namespace(script("post-extraction", {"grace": "5"}),
                         setup=SGLANG + STUBBORN + SLOW + BYSTANDERS
                         + "mkdir -p /dev/shm/sglang_hs; echo x > /dev/shm/sglang_hs/a\n",
                         after="ls /dev/shm\n")
    rep = r.report
    assert rep.error is None, rep.error
    assert rep.verified is True
    assert [g.memory_used_mib for g in rep.gpus if g.index != 4] == [0] * 7
    assert [s.status for s in rep.stages] == ["ok"] * 7
    assert not r.alive("sglang") and not r.alive("orphan-helper")
    assert not r.alive("stubborn-holder") and not r.alive("slow-holder")
    assert r.alive("python3-monitor-agent") and r.alive("nvidia-persistenced")
    sent = {(s.cmdline.split()[-1], s.signal) for s in rep.signalled}
    assert ("stubborn-holder", "KILL") in sent  # ignored TERM: escalated, and reported
    assert ("slow-holder", "TERM") in sent and ("slow-holder", "KILL") not in sent
    assert ("orphan-helper", "TERM") in sent  # reparented, caught through its session
    assert "sglang_hs" not in after(r)


@pytest.mark.parametrize("name", ["pre-restart", "status"])
def test_other_builtins_spare_monitor_and_persistenced(name: str) -> None:
    r = run_in_namespace(script(name), setup=SGLANG + BYSTANDERS)
    assert r.alive("python3-monitor-agent") and r.alive("nvidia-persistenced")
    if name == "status":
        assert r.alive("sglang.launch_server") and not r.report.signalled
        assert r.report.verified is False  # GPUs held: status reads them, touches nothing
        holders = {p.name.split()[-1] for p in r.report.processes}
        assert "8" in holders  # the server's cmdline ends in "--tp 8"
    else:
        assert r.report.verified is True and not r.alive("sglang")


def test_pattern_in_the_invoking_shells_argv_does_not_kill_the_teardown() -> None:
    # The invoking shell is `bash -c '... sglang ...; bash -s'`, as in the seed command.
    r = run_in_namespace(script("pre-restart"), setup=SGLANG,
                         run="bash -c ': pkill -f sglang; bash -s'")
    assert r.report.error is None
    assert [s.name for s in r.report.stages] == ["stop-server", "kill-workers",
                                                 "kill-gpu-holders"]
    assert r.report.verified is True


def test_check_mode_lists_and_changes_nothing() -> None:
    r = run_in_namespace(
        script("post-extraction", {"model_file": "/tmp/m.py"}, check=True),
        setup=SGLANG + "echo new > /tmp/m.py; echo old > /tmp/m.py.bak_hsdump\n"
              "mkdir -p /dev/shm/sglang_hs\n",
        after="cat /tmp/m.py; ls -d /dev/shm/sglang_hs\n")
    by = {s.name: s for s in r.report.stages}
    assert by["stop-server"].status == "changed" and by["stop-server"].matched == 4
    assert by["restore-model"].status == "changed" and by["remove-dump"].status == "changed"
    assert not r.report.signalled and r.alive("sglang.launch_server")
    assert "new\n/dev/shm/sglang_hs" in after(r)


def test_restore_puts_content_and_mode_back() -> None:
    r = run_in_namespace(
        script("post-extraction", {"model_file": "/tmp/model.py"}),
        setup="echo patched > /tmp/model.py; chmod 600 /tmp/model.py\n"
              "echo original > /tmp/model.py.bak_hsdump; chmod 754 /tmp/model.py.bak_hsdump\n",
        after="cat /tmp/model.py; stat -c 'mode=%a' /tmp/model.py; ls -a /tmp\n")
    assert r.report.error is None
    assert "original\nmode=754\n" in after(r) and ".fleetclean-restore" not in after(r)


def test_restore_with_missing_backup_fails_clearly() -> None:
    r = run_in_namespace(script("post-extraction", {"model_file": "/tmp/model.py"}),
                         setup="echo patched > /tmp/model.py\n", after="cat /tmp/model.py\n")
    assert r.report.error == ("stage 'restore-model' failed: backup missing: "
                              "/tmp/model.py.bak_hsdump (cannot restore /tmp/model.py)")
    assert "patched" in after(r)
    assert r.report.verified is True  # later stages and verification still ran


def test_guard_refuses_while_a_writer_is_open_and_signals_nothing() -> None:
    r = run_in_namespace(
        script("post-extraction", {"guard_path": "/dev/shm/sglang_hs"}),
        setup="mkdir -p /dev/shm/sglang_hs\n" + SGLANG
              + "spawn w --setsid --write /dev/shm/sglang_hs/part.bin writer-task\n")
    assert r.report.error is not None
    assert r.report.error.startswith("refused: /dev/shm/sglang_hs has writers: pid ")
    assert "writer-task" in r.report.error
    assert [s.status for s in r.report.stages] == ["refused"] + ["skipped"] * 6
    assert not r.report.signalled and r.alive("sglang.launch_server")


def test_guard_sees_a_writer_through_a_symlinked_path() -> None:
    # The kernel names the open file by its real path: guard_path through a symlink never
    # matched it, and the teardown went ahead over a dump being written.
    r = run_in_namespace(
        script("post-extraction", {"guard_path": "/tmp/dumps"}),
        setup="mkdir -p /dev/shm/sglang_hs; ln -s /dev/shm/sglang_hs /tmp/dumps\n" + SGLANG
              + "spawn w --setsid --write /dev/shm/sglang_hs/part.bin writer-task\n")
    assert r.report.error is not None and "writer-task" in r.report.error, r.report
    assert not r.report.signalled and r.alive("sglang.launch_server")


def test_guard_is_overridden_by_force() -> None:
    r = run_in_namespace(
        script("post-extraction", {"guard_path": "/dev/shm/sglang_hs"}, force=True),
        setup="mkdir -p /dev/shm/sglang_hs\n"
              "spawn w --setsid --write /dev/shm/sglang_hs/part.bin writer-task\n")
    assert r.report.stages[0].status == "ok" and "forced" in r.report.stages[0].message


def test_remove_refuses_globs_that_match_nothing_unless_missing_ok(tmp_path: Any) -> None:
    from fleetclean.engine.playbook import load_playbook as load
    pb = load(playbook_file(tmp_path, "name: rm\nstages:\n"
                            "  - {name: rm, type: remove, paths: ['/tmp/d/*.bin', '/tmp/e']}\n"))
    r = run_in_namespace(render_script(resolve(pb, {}, {})),
                         setup="mkdir -p /tmp/e /tmp/d\n", after="ls -d /tmp/e\n")
    assert r.report.error == "stage 'rm' failed: not found: /tmp/d/*.bin"


@pytest.mark.parametrize(("path", "survives"), [
    # A trailing '/' on a symlink: rm emptied the directory it names; the link alone goes.
    ("/tmp/dump/cache/", True),
    # A glob through a symlinked directory: refused, the victim's files kept.
    ("/tmp/shm/sglang_hs/*", True),
    # A bind mount under the path (the same device: rm's --one-file-system let it through).
    ("/tmp/dump2", True),
])
def test_remove_never_reaches_through_a_symlink_or_into_a_bind_mount(
    tmp_path: Any, path: str, survives: bool
) -> None:
    pb = load_playbook(playbook_file(tmp_path, (
        "name: rm\nstages:\n  - {name: rm, type: remove, paths: ['" + path + "']}\n")))
    r = run_in_namespace(
        render_script(resolve(pb, {}, {})),
        setup="mkdir -p /tmp/victim /tmp/dump /tmp/shm /tmp/dump2/mnt; touch /tmp/victim/keep\n"
              "ln -s /tmp/victim /tmp/dump/cache; ln -s /tmp/victim /tmp/shm/sglang_hs\n"
              "mount --bind /tmp/victim /tmp/dump2/mnt\n",
        after="ls /tmp/victim; ls -A /tmp/dump\n")
    assert ("keep" in after(r)) is survives, (r.report, after(r))
    if path.endswith("/"):  # the link itself went, as asked
        assert r.report.stages[0].status == "ok" and "cache" not in after(r), after(r)
    else:
        assert r.report.stages[0].status == "failed", r.report


@pytest.mark.parametrize(("setup", "status", "shows"), [
    # A symlink is restored where it points (renamed over, the link became a copy and the
    # file it named stayed patched); the link stays a link.
    ("echo PATCHED > /tmp/real.py; ln -s /tmp/real.py /tmp/m.py; echo ORIG > /tmp/m.py.bak",
     "ok", "ORIG link"),
    # A backup that is the file itself holds the patch: said, not "restored".
    ("echo PATCHED > /tmp/m.py; ln /tmp/m.py /tmp/m.py.bak", "failed", "PATCHED file"),
    ("mkdir /tmp/m.py; echo ORIG > /tmp/m.py.bak; echo PATCHED > /tmp/real.py", "failed",
     "PATCHED dir"),
])
def test_restore_puts_the_original_back_or_says_it_did_not(
    tmp_path: Any, setup: str, status: str, shows: str
) -> None:
    pb = load_playbook(playbook_file(tmp_path, (
        "name: r\nstages:\n  - {name: r, type: restore, file: /tmp/m.py, "
        "backup_suffix: .bak}\n")))
    r = run_in_namespace(render_script(resolve(pb, {}, {})), setup=setup + "\n",
                         after="cat /tmp/real.py 2>/dev/null || cat /tmp/m.py; "
                               "if [ -L /tmp/m.py ]; then echo link; elif [ -d /tmp/m.py ]; "
                               "then echo dir; else echo file; fi\n")
    assert r.report.stages[0].status == status, r.report
    assert " ".join(after(r).split()) == shows, after(r)


def test_sshd_session_and_a_protected_name_longer_than_the_kernels_15_bytes_are_spared(
    tmp_path: Any,
) -> None:
    # OpenSSH 9.8+ names each connection's process sshd-session; the kernel keeps a name
    # (comm) to 15 bytes, so "fcrev-jupyter-notebook" is "fcrev-jupyter-n" there.
    pb = load_playbook(playbook_file(tmp_path, (
        "name: s\nvars: {protect: [fcrev-jupyter-notebook]}\nstages:\n"
        "  - {name: s, type: signal, pattern: 'sshd-session|fcrev-jupyter|fcrev-victim', "
        "grace: 1}\n")))
    r = run_in_namespace(
        render_script(resolve(pb, {}, {})),
        # argv[0] as such processes have it (a title; a shorter name): only the
        # kernel's name says what they are.
        setup="for n in sshd-session:sshd-session: fcrev-jupyter-notebook:fcrev-jupyter "
              "fcrev-victim:fcrev-victim; do\n"
              "  cp /bin/sleep /tmp/${n%%:*}\n"
              "  (setsid bash -c 'exec -a \"$1\" \"$0\" 1000' /tmp/${n%%:*} \"${n#*:}\" "
              "</dev/null >/dev/null 2>&1 &)\n"
              "done; sleep 0.3\n",
        after="ps -eo comm= | grep -E '^(sshd-session|fcrev)' | sort\n")
    assert after(r).split() == ["fcrev-jupyter-n", "sshd-session"], (after(r), r.report)


def test_a_dot_glob_removes_the_hidden_files_not_dot_and_dot_dot(tmp_path: Any) -> None:
    # Before bash 5.2 (globskipdots, emulated here) dir/.* gave "." and "..", which rm
    # refuses: the stage failed.
    pb = load_playbook(playbook_file(tmp_path, (
        "name: rm\nstages:\n  - {name: rm, type: remove, paths: ['/tmp/d/.*']}\n")))
    r = run_in_namespace("shopt -u globskipdots 2>/dev/null\n" + render_script(
        resolve(pb, {}, {})), setup="mkdir -p /tmp/d; touch /tmp/d/.hidden /tmp/d/seen\n",
        after="ls -A /tmp/d\n")
    assert r.report.stages[0].status == "ok", r.report
    assert after(r).split() == ["seen"]


@pytest.mark.parametrize(("given", "says"), [
    ("unset SLURM_JOB_ID", "SLURM_JOB_ID is not set,"),
    ("export SLURM_JOB_ID=x7", "SLURM_JOB_ID is not a job number: x7,"),
])
def test_an_epilog_with_no_job_number_touches_nothing(given: str, says: str) -> None:
    # Its scope is the finished job: without SLURM_JOB_ID every job's processes were in it,
    # and a run by hand on a shared node killed another job's server.
    from fleetclean.engine.export import render_epilog
    epilog = render_epilog(resolve(load_playbook("post-extraction"), {}, {}),
                           log="/tmp/epilog.log")
    r = run_in_namespace(given + "\n" + epilog, setup=SGLANG, after="cat /tmp/epilog.log\n")
    assert r.script_rc == 2
    assert says in after(r), after(r)
    assert not r.report.signalled and r.alive("sglang.launch_server")


def test_a_glob_under_a_site_symlink_higher_up_still_removes(tmp_path: Any) -> None:
    # /scratch -> /lustre is a site's layout: only a glob's own directory being a symlink
    # is refused.
    pb = load_playbook(playbook_file(tmp_path, (
        "name: rm\nstages:\n  - {name: rm, type: remove, paths: ['/tmp/site/dumps/*']}\n")))
    r = run_in_namespace(render_script(resolve(pb, {}, {})),
                         setup="mkdir -p /tmp/real/dumps; touch /tmp/real/dumps/a.bin\n"
                               "ln -s /tmp/real /tmp/site\n",
                         after="ls -A /tmp/real/dumps\n")
    assert r.report.stages[0].status == "ok", r.report
    assert after(r).split() == []


INJECTIONS = ["'; touch /tmp/pwned #", "$(touch /tmp/pwned)", "`touch /tmp/pwned`",
              "x\ntouch /tmp/pwned", "*"]


@pytest.mark.parametrize("value", INJECTIONS)
def test_injected_values_are_passed_literally(value: str, tmp_path: Any) -> None:
    text = ("name: inj\nvars: {v: x}\nstages:\n"
            "  - {name: sig, type: signal, pattern: 'zz{{ v }}', grace: 0}\n"
            "  - {name: rm, type: remove, paths: ['/tmp/x/{{ v }}'], missing_ok: true}\n"
            "  - {name: restore, type: restore, file: '/tmp/{{ v }}'}\n"
            "  - {name: guard, type: guard, path: '/tmp/{{ v }}'}\n"
            "  - {name: sh, type: shell, command: 'printf %s {{ v }} > /tmp/shell-out'}\n")
    pb = load_playbook(playbook_file(tmp_path, text))
    resolved = resolve(pb, {}, {"v": value})
    r = run_in_namespace(render_script(resolved),
                         setup="mkdir -p /tmp/x; touch /tmp/x/keep\n",
                         after="ls /tmp/pwned 2>&1; ls /tmp/x; "
                               "printf '[%s]' \"$(cat /tmp/shell-out)\"\n")
    assert "No such file" in after(r)  # the canary never appeared
    assert "keep" in after(r)  # "*" was not expanded into /tmp/x/keep
    assert f"[{value}]" in after(r)
    assert [s.name for s in r.report.stages] == ["sig", "rm", "restore", "guard", "sh"]


def test_second_concurrent_run_reports_busy() -> None:
    body = script("pre-restart", {"lock_wait": "0.3"})
    # The first run holds the lock; in the meantime the second one runs.
    r = run_in_namespace(
        body,
        setup="mkdir -m 0700 /run/fleetclean-lock; exec 8>/run/fleetclean-lock/lock; flock 8\n",
        run="bash -s; exec 8>&-")
    assert r.report.busy
    assert r.report.error == "host busy: another fleetclean run holds /run/fleetclean-lock/lock"
    assert r.report.stages == ()


def test_two_rendered_scripts_at_once_one_is_busy() -> None:
    body = script("pre-restart", {"lock_wait": "0.2", "grace": "3"})
    r = run_in_namespace(
        body,
        setup=STUBBORN,
        run="cat > /tmp/s.sh; (bash -s < /tmp/s.sh > /tmp/first.out) & sleep 0.5; "
            "bash -s < /tmp/s.sh; wait",
        after="grep -c 'lock\tok' /tmp/first.out\n")
    assert r.report.busy
    assert after(r).endswith("1\n")


def test_nvidia_smi_failures_become_host_errors() -> None:
    # A driver/library mismatch is a fault (a reboot is due), not a failed tool.
    r = run_in_namespace(script("status"), setup="echo nvml > /tmp/fake-nvsmi-mode\n")
    (fault,) = r.report.faults
    assert r.report.error is None and fault.startswith(
        "nvidia-smi exit 18 (the NVIDIA driver and its library differ: the driver was "
        "upgraded and not reloaded; reboot the node): ")
    assert fault.endswith("Failed to initialize NVML: Driver/library version mismatch")
    r = run_in_namespace(script("status"), setup="echo na > /tmp/fake-nvsmi-mode\n")
    assert r.report.error is not None and "[N/A]" in r.report.error
    r = run_in_namespace(script("status"), setup="rm /tmp/fakebin/nvidia-smi\n")
    assert r.report.error == "nvidia-smi: command not found"


# Each record as the reader got it: (seconds, kind, first field), timestamped on arrival.
STAMPED = ('bash -s | while IFS= read -r l; do printf "%s\\t%s\\n" "$EPOCHREALTIME" "$l"; '
           "done > /tmp/stamped")


def arrivals(r: Any) -> dict[tuple[str, str], float]:
    out = {}
    for line in after(r).splitlines():
        at, _, record = line.partition("\t")
        fields = record.split("\t")
        if fields[0] == "@@fleetclean" and len(fields) > 2:
            out.setdefault((fields[1], fields[2]), float(at))
    return out


def test_what_is_written_before_a_lock_wait_arrives_before_it() -> None:
    # Records written together go out in one write (lib.sh: fc_hold), never held across a
    # wait: the controller sees the host begin while it waits for another run's lock.
    r = run_in_namespace(
        script("pre-restart", {"lock_wait": "1"}),
        setup="mkdir -m 0700 /run/fleetclean-lock; exec 8>/run/fleetclean-lock/lock; flock 8\n",
        run=f"{STAMPED}; exec 8>&-", after="cat /tmp/stamped\n")
    got = arrivals(r)
    assert got[("lock", "busy")] - got[("begin", "1")] > 0.8
    assert ("done", "0") in got  # what was held after the wait was written too


def test_a_stage_is_seen_starting_before_its_work_ends(tmp_path: Any) -> None:
    pb = load_playbook(playbook_file(tmp_path, (
        "name: nap\nstages:\n"
        "  - {name: first, type: remove, paths: ['/tmp/none'], missing_ok: true}\n"
        "  - {name: nap, type: shell, command: 'sleep 1'}\n")))
    r = run_in_namespace(render_script(resolve(pb, {}, {})), run=STAMPED,
                         after="cat /tmp/stamped\n")
    got = arrivals(r)
    # The first stage's end, held until the next record, left with the second's start,
    # not after its sleep.
    assert got[("end", "2")] - got[("end", "1")] > 0.8
    assert got[("end", "2")] - got[("stage", "2")] > 0.8
    assert ("done", "0") in got


# A holder of GPU 5 started by a shell stage, once it holds the device file.
LATE_HOLDER = ('"$FC_PY" /tmp/workload.py --ready /tmp/ready.late --hold /dev/nvidia5 late-holder '
               "</dev/null >/dev/null 2>&1 & "
               "for i in $(seq 100); do [ -e /tmp/ready.late ] && break; sleep 0.05; done")


def gpu_reads(r: Any) -> int:
    """How many times the script asked nvidia-smi for the GPUs' memory."""
    return sum(line.startswith("--query-gpu=") for line in after(r).splitlines())


def holders_then(tmp_path: Any, *later: str) -> str:
    """A playbook: gpu-holders, then the stages ``later``, then a verification of 1 s."""
    stages = "".join(f"  - {stage}\n" for stage in later)
    return render_script(resolve(load_playbook(playbook_file(tmp_path, (
        "name: kept\nstages:\n  - {name: holders, type: gpu-holders, grace: 1}\n"
        f"{stages}verify: {{max_used_mib: 0, timeout: 1}}\n"))), {}, {}))


def test_the_verification_takes_the_gpu_holders_read_when_nothing_changed_since(
        tmp_path: Any) -> None:
    r = run_in_namespace(holders_then(
        tmp_path, "{name: files, type: remove, paths: ['/tmp/none'], missing_ok: true}"),
        setup=BYSTANDERS, after="cat /tmp/fake-nvsmi-calls\n")
    assert r.report.verified is True
    assert [g.memory_used_mib for g in r.report.gpus] == [0] * 8
    assert gpu_reads(r) == 1  # the stage's read served the verification
    assert r.alive("nvidia-persistenced") and r.alive("python3-monitor-agent")


def test_a_gpu_taken_after_the_gpu_holders_read_is_seen_by_the_verification(
        tmp_path: Any) -> None:
    # A shell stage may change any GPU: the kept read is dropped and the GPUs read again.
    command = LATE_HOLDER.replace("'", "''")
    late = f"{{name: late, type: shell, command: '{command}'}}"
    r = run_in_namespace(holders_then(tmp_path, late), after="cat /tmp/fake-nvsmi-calls\n")
    assert r.report.stages[1].status == "ok"
    assert r.report.verified is False
    assert {g.index: g.memory_used_mib for g in r.report.gpus}[5] == 1000
    assert r.alive("late-holder")


@pytest.mark.parametrize(("pattern", "reads"), [("python3-monitor-agent", 2),
                                                ("no-such-process", 1)])
def test_only_a_signal_sent_after_the_gpu_holders_read_makes_the_verification_read_again(
        tmp_path: Any, pattern: str, reads: int) -> None:
    r = run_in_namespace(holders_then(
        tmp_path, f"{{name: agent, type: signal, pattern: {pattern}, grace: 1}}"),
        setup=BYSTANDERS, after="cat /tmp/fake-nvsmi-calls\n")
    assert bool(r.alive("python3-monitor-agent")) == (reads == 1)
    assert r.alive("nvidia-persistenced")
    assert r.report.verified is True
    assert gpu_reads(r) == reads
