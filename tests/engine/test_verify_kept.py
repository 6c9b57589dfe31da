"""The read the gpu-holders stage keeps for the verification (``verify.sh``:
``fc_verify_keep``): which stages after it drop it (``lib-stage.sh``: ``fc_gpus_untouched``),
and the settle, which a kept read may not confirm from inside its window
(``fc_verify_settle``). Each case is one ``bash`` with the packaged files loaded and the
state a run would leave set by hand; ``fc_nap`` is replaced by a function that records
how long it was asked to sleep, so nothing here waits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.stages import template

# Microseconds; the kept read began at READ, 100 ms after the last signal at SIGNAL.
SIGNAL = 1_000_000_000
READ = SIGNAL + 100_000


def bash(body: str, env: dict[str, str] | None = None) -> str:
    script = "\n".join([template("lib.sh"), template("lib-stage.sh"), template("verify.sh"),
                        'fc_nap() { echo "nap $1"; }', body])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                          timeout=30, env=env).stdout


@pytest.mark.parametrize(("stage", "status", "signal_at", "extra", "kept"), [
    ("remove", "ok", SIGNAL, "", True),
    ("restore", "ok", SIGNAL, "", True),
    ("signal", "ok", SIGNAL, "", True),  # signalled nothing after the read
    ("signal", "ok", READ + 5_000, "", False),  # signalled after it began
    ("gpu-holders", "denied", SIGNAL, "", False),  # not ok
    ("gpu-reset", "ok", SIGNAL, "FC_MATCHED=0", True),  # no leak, nothing held
    ("gpu-reset", "ok", SIGNAL, "FC_MATCHED=1", False),  # reset a GPU
    ("gpu-reset", "ok", SIGNAL, "FC_MATCHED=0 FC_GR_HELD=' GPU0 (77)'", False),  # saw it held
    ("gpu-reset", "failed", SIGNAL, "FC_MATCHED=0", False),  # nvidia-smi failed since
    ("shell", "ok", SIGNAL, "", False),  # may have done anything
    ("owner", "ok", SIGNAL, "", False),
])
def test_which_stages_after_the_read_keep_it(stage: str, status: str, signal_at: int,
                                             extra: str, kept: bool) -> None:
    out = bash(f"FC_VKEPT=1 FC_VKEPT_US={READ} FC_LAST_SIGNAL_US={signal_at} "
               f"FC_STATUS={status} FC_MATCHED=0 {extra}\n"
               f"if fc_gpus_untouched {stage}; then echo kept; else echo dropped; fi")
    assert out.strip() == ("kept" if kept else "dropped")


def test_dropping_the_read_drops_its_kernel_log_too() -> None:
    out = bash("FC_VKEPT=1 FC_VXIDREAD=1 FC_VXIDTEXT='[ 1.0] NVRM: Xid (PCI:0000:18:00): 79,'\n"
               "fc_verify_drop; echo \"$FC_VKEPT $FC_VXIDREAD [$FC_VXIDTEXT]\"")
    assert out.strip() == "0 0 []"  # the verification reads both anew


def test_a_clean_read_begun_inside_the_settle_is_read_again_even_once_the_window_is_over(
        ) -> None:
    # The kept read began 100 ms after the signal; stages after it took the rest of the
    # 1 s window: no wait is left, but that read cannot confirm the GPUs stayed free.
    out = bash(f"opt_settle_ms=1000 FC_LAST_SIGNAL_US={SIGNAL} FC_VREAD_US={READ}\n"
               "if fc_verify_settle; then echo again; else echo confirmed; fi")
    assert out.splitlines() == ["again"]  # at once: its clock is past the window


def test_a_read_begun_after_the_settle_confirms() -> None:
    out = bash(f"opt_settle_ms=1000 FC_LAST_SIGNAL_US={SIGNAL} "
               f"FC_VREAD_US={SIGNAL + 1_200_000}\n"
               "if fc_verify_settle; then echo again; else echo confirmed; fi")
    assert out.splitlines() == ["confirmed"]


def test_inside_the_window_the_rest_of_it_is_waited_out() -> None:
    out = bash("opt_settle_ms=1000; fc_now_us; FC_LAST_SIGNAL_US=$REPLY FC_VREAD_US=$REPLY\n"
               "if fc_verify_settle; then echo again; else echo confirmed; fi")
    nap, again = out.splitlines()
    assert again == "again" and 0.9 < float(nap.split()[1]) <= 1.0


# nvidia-smi as a function: every call logged to $CALLS, eight GPUs, GPU0 at $USED0 MiB on
# the first GPU query (the kept read) and idle after; -q refused, as a driver too old for
# the read, so the CSV queries answer. dmesg and ls log their calls too.
SMI = r"""
nvidia-smi() {
    local used=0
    echo "smi $1" >>"$CALLS"
    case $1 in
        --query-gpu=*)
            [[ -e $CALLS.first ]] || { used=${USED0:-0}; : >"$CALLS.first"; }
            echo "0, GPU-0, NVIDIA H200, $used, 143771, [N/A], No"
            for i in 1 2 3 4 5 6 7; do echo "$i, GPU-$i, NVIDIA H200, 0, 143771, [N/A], No"; done
            ;;
        --query-compute-apps=*) ;;
        *) return 2 ;;
    esac
}
dmesg() { echo dmesg >>"$CALLS"; }
ls() { echo "ls $*" >>"$CALLS"; command ls "$@"; }
opt_max_used_mib=0 opt_timeout_ms=1000 opt_interval_s=0.2 opt_interval_ms=200
opt_settle_ms=1000 opt_leak_quiet_ms=1000
FC_HALT=0 FC_CHECK=0 FC_RESPAWN_RISK=0 FC_SCOPE_GPUS_ON=0 FC_DENIED_ANY=0
fc_verify_keep
"""


def verify_after_keep(tmp_path: Path, aged_ms: int = 0, used0: int = 0) -> tuple[str, str]:
    """fc_verify after fc_verify_keep (its read aged by ``aged_ms``, GPU0 at ``used0`` MiB
    in it): the calls it made itself, and its records."""
    calls = tmp_path / "calls"
    records = bash("\n".join([SMI, f"FC_VKEPT_END_US=$((FC_VKEPT_END_US - {aged_ms} * 1000))",
                              'echo mark >>"$CALLS"', "fc_verify", "fc_release"]),
                   env={"PATH": "/usr/bin:/bin", "CALLS": str(calls), "USED0": str(used0)})
    before, _, after = calls.read_text().partition("mark\n")
    assert "smi --query-gpu" in before and "dmesg" in before  # the kept read, its log
    return after, records


@pytest.mark.parametrize(("aged_ms", "reads", "logs"), [(0, 0, 0), (500, 1, 1)])
def test_a_kept_read_older_than_one_poll_is_not_taken(tmp_path: Path, aged_ms: int,
                                                      reads: int, logs: int) -> None:
    after, records = verify_after_keep(tmp_path, aged_ms=aged_ms)
    assert after.count("smi --query-gpu") == reads
    assert after.count("dmesg") == logs  # dropped whole: its kernel log too
    assert "\tverify\tok\t" in records  # clean either way


def test_a_dirty_kept_read_is_not_taken_but_its_kernel_log_is(tmp_path: Path) -> None:
    # On a real GPU the kept read mostly still shows the memory of what was just killed:
    # a new read, not an explanation of the old one (every process's device files).
    after, records = verify_after_keep(tmp_path, used0=50000)
    assert after.count("smi --query-gpu") == 1 and "dmesg" not in after
    assert "ls " not in after  # the dirty read was not explained
    assert "\tverify\tok\t" in records and "\t50000\t" not in records


def test_a_stage_after_a_failed_read_still_drops_the_kernel_log_it_kept() -> None:
    # nvidia-smi failed in the gpu-holders stage (nothing kept to read from), but the
    # kernel log was read: a stage that may have changed a GPU makes it stale too.
    out = bash("fc_stage_fake() { :; }\nFC_VKEPT=0 FC_VXIDREAD=1 FC_VXIDTEXT=x FC_HALT=0\n"
               'fc_stage 1 later fake >/dev/null; echo "$FC_VXIDREAD [$FC_VXIDTEXT]"')
    assert out.strip() == "0 []"
