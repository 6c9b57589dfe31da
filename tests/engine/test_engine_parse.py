"""Parser tests on real nvidia-smi outputs and on damaged or hostile script output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.results.nvsmi import (
    APP_FIELDS,
    NvsmiParseError,
    parse_compute_apps,
    parse_query_gpu,
)
from fleetclean.results.parse import parse_script_output

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi" / "h200"
LIB = Path(__file__).resolve().parents[2] / "fleetclean" / "engine" / "stages" / "lib.sh"
UUID = "GPU-fa529bc3-df9c-8e3c-22fb-c95e99d1c9dc"


def fixture(name: str) -> tuple[str, int]:
    """A fixture's output and exit status (its last line `__rc=N` is not output)."""
    text = (DATA / name).read_text()
    body, _, rc = text.rstrip("\n").rpartition("__rc=")
    return body, int(rc)


def rec(*fields: str) -> str:
    return "\t".join(["@@fleetclean", *fields]) + "\n"


def test_query_nounits_fixture() -> None:
    text, rc = fixture("q_nounits.txt")
    rows = parse_query_gpu(text, ["index", "memory.used", "memory.total"], nounits=True,
                           header=False)
    assert rc == 0 and rows[0].index == 0 and rows[0].memory_used_mib == 0
    assert rows[0].memory_total_mib == 143771


def test_query_with_units_and_header_fixtures() -> None:
    text, _ = fixture("q_header.txt")
    rows = parse_query_gpu(text, ["index", "memory.used"], nounits=False, header=True)
    assert rows[0].memory_used_mib == 0
    text, _ = fixture("q_seed.txt")
    assert parse_query_gpu(text, ["index", "memory.used"], nounits=False,
                           header=False)[0].memory_used_mib == 0


def test_query_full_fixture_keeps_name_and_uuid() -> None:
    fields = ["index", "uuid", "name", "pci.bus_id", "memory.used", "memory.total",
              "memory.reserved", "utilization.gpu", "temperature.gpu", "power.draw",
              "mig.mode.current", "persistence_mode", "driver_version"]
    for name, nounits in (("q_full.txt", False), ("q_full_nounits.txt", True)):
        text, _ = fixture(name)
        row = parse_query_gpu(text, fields, nounits=nounits, header=False)[0]
        assert (row.uuid, row.name, row.memory_total_mib) == (UUID, "NVIDIA H200", 143771)


def test_compute_apps_fixtures() -> None:
    text, _ = fixture("apps_held_plain_TERM.txt")
    apps = parse_compute_apps(text, [*APP_FIELDS, "gpu_bus_id"], nounits=False)
    assert [(a.pid, a.name, a.used_memory_mib, a.gpu_uuid) for a in apps] == [
        (6742, "python3", 41478, UUID)]
    text, _ = fixture("apps_empty.txt")
    assert parse_compute_apps(text) == []


def test_not_available_values_become_none() -> None:
    rows = parse_query_gpu("0, GPU-x, NVIDIA H200, [N/A], [Not Supported]",
                           ["index", "uuid", "name", "memory.used", "memory.total"],
                           nounits=True, header=False)
    assert rows[0].memory_used_mib is None and rows[0].memory_total_mib is None


def test_gpu_name_with_comma_is_kept_whole() -> None:
    rows = parse_query_gpu("3, GPU-x, Weird, Name, 5, 10",
                           ["index", "uuid", "name", "memory.used", "memory.total"],
                           nounits=True, header=False)
    assert rows[0].name == "Weird, Name" and rows[0].memory_used_mib == 5


def test_bad_field_fixture_is_an_error_with_nvidia_smis_words() -> None:
    text, rc = fixture("bad_field.txt")
    with pytest.raises(NvsmiParseError, match=r'Field "bogus\.field" is not a valid field'):
        parse_query_gpu(text, ["index", "memory.used"], nounits=True, header=False)
    assert rc == 2


def full_run(*middle: str) -> str:
    return (rec("begin", "1", "post-extraction", "n1", "0") + rec("lock", "ok", "/run/lock/x")
            + "".join(middle) + rec("done", "0"))


def test_verify_ok_report() -> None:
    out = full_run(
        rec("stage", "1", "stop", "signal"),
        rec("match", "1", "42", "python3 -m sglang.launch_server"),
        rec("signal", "1", "42", "TERM", "python3 -m sglang.launch_server"),
        rec("end", "1", "ok", "1", "1", "0", "230", "1 signal(s) sent; all 1 gone"),
        rec("stage", "verify", "verify", "verify"),
        rec("gpu", "0, GPU-a, NVIDIA H200, 0, 143771"),
        rec("holder", "7", "/dev/nvidia0", "python3 monitor.py"),
        rec("verify", "ok", "0", "21", "every GPU at or under 0 MiB"))
    r = parse_script_output("banner from a login script\n" + out, "warning: x", 0)
    assert r.error is None and r.verified is True
    assert r.stages[0].duration_s == 0.23 and r.stages[0].signalled == 1
    assert r.signalled[0].stage == "stop" and r.signalled[0].signal == "TERM"
    assert r.processes[0].gpu_uuid == "GPU-a" and r.processes[0].name == "python3 monitor.py"


def test_a_holder_of_a_gpu_whose_minor_is_not_its_index_is_put_on_that_gpu() -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("gpu", "0, GPU-a, NVIDIA H200, 500, 143771"),
                   rec("gpu", "1, GPU-b, NVIDIA H200, 0, 143771"),
                   rec("holder", "7", "/dev/nvidia1", "python3 train.py", "", "0"),
                   rec("holder", "8", "/dev/nvidia0", "python3 old.py", ""),
                   rec("verify", "dirty", "0", "21", "1 GPU(s) above 0 MiB", "deadline"))
    r = parse_script_output(out, "", 0)
    # The index field names the GPU; a record without one (older scripts) the device file.
    assert {p.pid: p.gpu_uuid for p in r.processes} == {7: "GPU-a", 8: "GPU-a"}


def test_verify_dirty_is_not_an_error() -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("gpu", "0, GPU-a, NVIDIA H200, 500, 143771"),
                   rec("verify", "dirty", "0", "30000", "1 GPU(s) above 0 MiB"))
    r = parse_script_output(out, "", 0)
    assert r.verified is False and r.error is None and r.gpus[0].memory_used_mib == 500


def test_nvml_exit_18_becomes_host_error_with_its_message() -> None:
    msg = "Failed to initialize NVML: Insufficient Permissions"
    out = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", "18", msg),
                   rec("verify", "error", "0", "20", f"nvidia-smi exit 18: {msg}"))
    r = parse_script_output(out, "", 0)
    assert r.error == f"nvidia-smi failed (exit 18): {msg}" and r.verified is None
    assert r.faults == ()


@pytest.mark.parametrize(("code", "said", "why"), [
    # A driver upgraded and not reloaded: no CUDA job runs there until a reboot.
    ("18", "Failed to initialize NVML: Driver/library version mismatch", "reboot the node"),
    # A GPU whose handle fails with NVML's Unknown Error: not exit 15, still a broken GPU.
    ("255", "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error",
     "fallen off the bus"),
    ("255", "Failed to initialize NVML: No supported GPUs were found", "no GPU bound"),
    # Some versions say it with exit 0 (the verification then listed no GPU).
    ("0", "No devices were found", "no GPU found"),
])
def test_nvidia_smis_words_prove_a_fault_whatever_its_exit_status(
    code: str, said: str, why: str
) -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", code, said),
                   rec("verify", "error", "0", "20", f"nvidia-smi exit {code}: {said}"))
    r = parse_script_output(out, "", 0)
    assert len(r.faults) == 1 and why in r.faults[0] and said in r.faults[0], r.faults


def test_an_nvidia_smi_that_did_not_answer_is_the_drivers_fault_in_the_nodes_words() -> None:
    said = ("nvidia-smi did not answer in 30s (smi_timeout): PID 24 outlived SIGKILL, waiting "
            "in the GPU driver (state D): the driver is hung; see dmesg for Xid errors, then "
            "reset the GPUs or reboot the node")
    out = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", "124", said),
                   rec("verify", "error", "0", "30000", said))
    r = parse_script_output(out, "", 0)
    assert r.faults == (said,) and r.error is None and r.verified is None
    # One that SIGKILL ended was slow, perhaps only loaded: an error, in the same words.
    slow = ("nvidia-smi did not answer in 30s (smi_timeout) and was killed (PID 24): the GPU "
            "driver may be hung (see dmesg for Xid errors) or the node overloaded")
    out = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", "124", slow),
                   rec("verify", "error", "0", "30000", slow))
    r = parse_script_output(out, "", 0)
    assert r.faults == () and r.error == slow
    # Exit 124 from nvidia-smi itself (no such status is documented) proves nothing.
    other = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", "124", "odd"),
                     rec("verify", "error", "0", "20", "nvidia-smi exit 124: odd"))
    r = parse_script_output(other, "", 0)
    assert r.faults == () and r.error == "nvidia-smi failed (exit 124): odd"


def test_hosts_whose_driver_hung_alike_share_a_problem_line_whatever_their_pids() -> None:
    from fleetclean.fleet import host_result
    from fleetclean.models import HostResult, RunResult
    from fleetclean.results.table import problems
    from fleetclean.transport import ScriptOutput

    def hung(pids: str, killed: bool) -> str:
        return (f"nvidia-smi did not answer in 30s (smi_timeout) and was killed (PID {pids}): "
                "the GPU driver may be hung (see dmesg for Xid errors) or the node overloaded"
                if killed else f"nvidia-smi not started: PID {pids}, left by an earlier run, "
                "waiting in the GPU driver (state D): the driver is hung; see dmesg for Xid "
                "errors, then reset the GPUs or reboot the node (to try nvidia-smi all the "
                "same, delete /run/fleetclean-smi-stuck)")

    def host(name: str, said: str) -> HostResult:
        out = full_run(rec("stage", "verify", "verify", "verify"), rec("nvsmi", "124", said),
                       rec("verify", "error", "0", "30000", said))
        return host_result(name, ScriptOutput(started=True, stdout=out, stderr="",
                                              exit_code=0), 1.0)

    def stuck(pid: str) -> str:
        return (f"nvidia-smi did not answer in 30s (smi_timeout): PID {pid} outlived SIGKILL, "
                "waiting in the GPU driver (state D): the driver is hung; see dmesg for Xid "
                "errors, then reset the GPUs or reboot the node")

    hosts = [host("gpu01", hung("1721", False)), host("gpu02", hung("5961, 5962", False)),
             host("gpu03", hung("24", True)), host("gpu04", hung("31", True)),
             host("gpu05", stuck("4040")), host("gpu06", stuck("77"))]
    assert [h.status.value for h in hosts] == ["faulty"] * 2 + ["error"] * 2 + ["faulty"] * 2
    assert problems(RunResult("status", 1.0, tuple(hosts))) == [
        f"gpu[01-02]: faulty: {hung('<pid>', False)} (each host's PIDs: --json)",
        f"gpu[03-04]: error: {hung('<pid>', True)} (each host's PIDs: --json)",
        f"gpu[05-06]: faulty: {stuck('<pid>')} (each host's PIDs: --json)"]


def test_nvml_words_for_a_broken_gpu_in_memory_used_are_a_fault() -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("verify", "unknown", "0", "20", "nvidia-smi gave no number for "
                       "memory.used: GPU3=[GPU requires reset] (check the driver)"))
    r = parse_script_output(out, "", 0)
    assert r.faults == ("GPU3: memory.used reads '[GPU requires reset]': reset the GPU "
                        "(nvidia-smi -r -i 3) or reboot",)
    plain = full_run(rec("stage", "verify", "verify", "verify"),
                     rec("verify", "unknown", "0", "20", "nvidia-smi gave no number for "
                         "memory.used: GPU3=[N/A] (check the driver)"))
    assert parse_script_output(plain, "", 0).faults == ()


def test_missing_nvidia_smi_becomes_host_error() -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("nvsmi", "127", "nvidia-smi: command not found"),
                   rec("verify", "error", "0", "0", "nvidia-smi: command not found"))
    assert parse_script_output(out, "", 0).error == "nvidia-smi: command not found"


def test_not_available_memory_is_a_host_error() -> None:
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("gpu", "0, GPU-a, NVIDIA H200, [N/A], 143771"),
                   rec("verify", "unknown", "0", "20",
                       "nvidia-smi gave no number for memory.used: 0, GPU-a, [N/A]"))
    r = parse_script_output(out, "", 0)
    assert r.verified is None and "[N/A]" in (r.error or "")
    assert r.gpus[0].memory_used_mib is None


def test_truncated_output_names_the_stage_in_progress() -> None:
    out = (rec("begin", "1", "p", "n1", "0") + rec("stage", "2", "kill-workers", "signal")
           + "@@fleetclean\tsig")
    r = parse_script_output(out, "", None)
    assert r.error == ("output ended during stage 2 'kill-workers' (signal): connection "
                       "lost or script killed")
    assert r.stages[0].status == "failed"


def test_no_output_at_all() -> None:
    r = parse_script_output("", "bash: line 1: syntax error", 2)
    assert r.error == "script produced no records (exit status 2): bash: line 1: syntax error"


def test_lock_busy() -> None:
    out = (rec("begin", "1", "p", "n1", "0") + rec("lock", "busy", "/run/lock/fleetclean.lock")
           + rec("error", "host busy: another fleetclean run holds /run/lock/fleetclean.lock")
           + rec("done", "0"))
    r = parse_script_output(out, "", 0)
    assert r.busy and r.error == ("host busy: another fleetclean run holds "
                                  "/run/lock/fleetclean.lock")


def test_failed_stage_is_a_host_error() -> None:
    out = full_run(rec("stage", "5", "restore-model", "restore"),
                   rec("end", "5", "failed", "0", "0", "0", "1",
                       "backup missing: /m/x.py.bak_hsdump (cannot restore /m/x.py)"))
    assert parse_script_output(out, "", 0).error == (
        "stage 'restore-model' failed: backup missing: /m/x.py.bak_hsdump "
        "(cannot restore /m/x.py)")


HOSTILE = "python3 -c 'a\tb'\nsecond line %41 \r@@fleetclean\tdone\t0 ünï"


def test_hostile_cmdline_survives_the_bash_encoder() -> None:
    """The record is produced by the real lib.sh encoder, then parsed back."""
    out = subprocess.run(
        ["bash", "-c", f'source "{LIB}"; fc_rec signal 1 99 KILL "$X"; fc_rec end 1 ok 1 1 0 '
                       '5 "$X"'],
        env={"X": HOSTILE, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        check=True).stdout
    assert out.count("\n") == 2
    r = parse_script_output(rec("begin", "1", "p", "h", "0") + rec("stage", "1", "s", "signal")
                            + out + rec("done", "0"), "", 0)
    assert r.signalled[0].cmdline == HOSTILE and r.stages[0].message == HOSTILE


def test_stage_started_reads_one_progress_line() -> None:
    from fleetclean.results.parse import stage_started

    assert stage_started("@@fleetclean\tstage\t2\tstop%09server\tsignal") == "stop\tserver"
    assert stage_started("@@fleetclean\tsignal\t2\t41\tTERM\tx") is None
    assert stage_started("stage\t2\tstop-server") is None


def _teardown(*middle: str) -> str:
    return (rec("begin", "1", "post-extraction", "gpu01", "0")
            + rec("stage", "4", "kill-gpu-holders", "gpu-holders") + "".join(middle))


def test_stuck_left_and_reset_records_become_the_hosts_words() -> None:
    from fleetclean.fleet import host_result
    from fleetclean.results.reasons import notes
    from fleetclean.transport import ScriptOutput

    out = _teardown(
        rec("signal", "4", "41", "KILL", "python3 stuck.py"),
        rec("stuck", "4", "41", "python3 stuck.py"),
        rec("stuck", "4", "42", "python3 gone.py"),
        rec("end", "4", "ok", "2", "4", "2", "5100", "4 signal(s) sent; stuck ..."),
        rec("stage", "5", "reset-leaked", "gpu-reset"),
        rec("reset", "5", "6", "ok", "512 MiB freed"),
        rec("end", "5", "ok", "1", "0", "0", "900", "1 of 1 GPU(s) with leaked memory reset"),
        rec("stage", "verify", "verify", "verify"),
        rec("gpu", f"2, {UUID}, NVIDIA H200, 8192, 143771"),
        rec("app", f"41, python3, 8192, {UUID}"),
        rec("proc", "41", "root", "python3 stuck.py", "", "stuck"),
        rec("verify", "dirty", "0", "40", "held by processes stuck ...: GPU2", "stuck"),
        rec("left", "17", "python3 -m vllm.entrypoints.openai.api_server"),
        rec("unstuck", "42"),
        rec("done", "0"))
    host = host_result("gpu01", ScriptOutput(started=True, stdout=out, stderr="",
                                             exit_code=0), 6.0)
    assert host.status.value == "dirty" and host.verify_rule == "stuck"
    assert host.error == ("GPU2 8192 MiB; held by 41 python3 stuck.py (root; GPU2; stuck in "
                          "the kernel (state D) since SIGKILL: reboot or reset needed)")
    # What the problem lines fold hosts by: the same words, each holder's PID a placeholder.
    assert host.error_folded == host.error.replace("by 41 ", "by <pid> ")
    assert [p.pid for p in host.stuck] == [41]  # 42 let go before the script ended
    assert [s.status for s in host.stages] == ["ok", "ok"]  # stuck is not a failed stage
    assert notes(host) == [
        "left running: 17 python3 -m vllm.entrypoints.openai.api_server (parent of killed "
        "GPU holders)", "GPU6 reset: ok (512 MiB freed)"]


def test_an_exiting_holder_is_named_as_such_and_no_cuda_context_is_no_holder() -> None:
    from fleetclean.fleet import host_result
    from fleetclean.transport import ScriptOutput

    out = _teardown(
        rec("end", "4", "ok", "0", "0", "0", "10", "nothing to signal"),
        rec("stage", "verify", "verify", "verify"),
        rec("gpu", f"5, {UUID}, NVIDIA H200, 512, 143771"),
        rec("holder", "77", "/dev/nvidia5", "", ""),
        rec("holder", "9", "/dev/nvidia5", "python3 /opt/monitor/agent.py", "no CUDA context"),
        rec("proc", "77", "root", "", ""),
        rec("proc", "9", "root", "python3 /opt/monitor/agent.py", "no CUDA context"),
        rec("verify", "dirty", "0", "30000", "1 GPU(s) above 0 MiB after 30000 ms",
            "deadline"),
        rec("done", "0"))
    host = host_result("gpu01", ScriptOutput(started=True, stdout=out, stderr="",
                                             exit_code=0), 30.0)
    assert host.error == "GPU5 512 MiB; held by 77 (exiting) (root; GPU5)"


def test_a_listed_process_read_with_no_command_line_is_named_exiting() -> None:
    from fleetclean.fleet import host_result
    from fleetclean.transport import ScriptOutput

    # A zombie whose other thread holds the GPU: nvidia-smi lists its PID and cannot name
    # it; a PID the node did not read (another PID namespace's) keeps nvidia-smi's words.
    out = (rec("begin", "1", "status", "gpu01", "1") + rec("stage", "verify", "verify", "verify")
           + rec("gpu", f"2, {UUID}, NVIDIA H200, 8192, 143771")
           + rec("app", f"41, [Not Found], 4096, {UUID}")
           + rec("app", f"52, [Not Found], 4096, {UUID}")
           + rec("proc", "41", "root", "", "")
           + rec("verify", "dirty", "0", "40", "1 GPU(s) above 0 MiB after 40 ms", "deadline")
           + rec("done", "0"))
    host = host_result("gpu01", ScriptOutput(started=True, stdout=out, stderr="",
                                             exit_code=0), 1.0)
    assert host.error == ("GPU2 8192 MiB; held by 41 (exiting) (root; GPU2), "
                          "52 [Not Found] (GPU2)")


def test_an_app_line_cut_by_a_process_name_costs_only_that_line() -> None:
    """nvidia-smi prints a process's name as it is: one with a newline cuts its line in
    two. The other processes on the node are still named."""
    out = full_run(rec("stage", "verify", "verify", "verify"),
                   rec("gpu", "0, GPU-a, NVIDIA H200, 9000, 143771"),
                   rec("app", "41, python3, 8192, GPU-a"),
                   rec("app", "1234, trainer,"),
                   rec("app", "42, python3, 808, GPU-a"),
                   rec("verify", "dirty", "0", "30", "1 GPU(s) above 0 MiB"))
    r = parse_script_output(out, "", 0)
    assert sorted(p.pid for p in r.processes) == [41, 42]


@pytest.mark.parametrize("odd", ["\u2028", "\x0c", "\x0b", "\x1c", "\x85"])
def test_a_command_line_with_a_unicode_line_break_keeps_its_record_whole(odd: str) -> None:
    # str.splitlines breaks at these too, which the script does not escape: the "refused"
    # record of a process left to its Slurm job lost its later fields, and the dirty host
    # read as clean.
    from fleetclean.fleet import host_result
    from fleetclean.transport.base import ScriptOutput
    out = (rec("begin", "1", "p", "h", "0") + rec("stage", "1", "stop", "signal")
           + rec("owner", "41", "slurm", "7", "7")
           + rec("refused", "1", "41", f"python3 router{odd}--x", "Slurm job 7 (user ada)",
                 "scancel 7")
           + rec("end", "1", "ok", "1", "0", "0", "120", "not signalled: Slurm job 7")
           + rec("stage", "verify", "verify", "verify")
           + rec("verify", "ok", "0", "30", "every GPU at or under 0 MiB", "clean")
           + rec("done", "0"))
    result = host_result("h", ScriptOutput(out, "", 0, None, True), 1)
    assert result.status.value == "dirty", (result.status, result.error)
    assert repr(f"python3 router{odd}--x") in repr(parse_script_output(out, "", 0))
