"""The verification's read of the GPUs (``verify.sh``: ``fc_verify_read``) on captured real
output: one ``nvidia-smi -q -d MEMORY,PIDS,ROW_REMAPPER`` gives the same rows and compute
apps as the two CSV queries did, and anything it cannot take for certain sends it to them;
the row remapper's section is left out only where the kernel log rules a pending remap out
(``fc_verify_gate``).

Each case is one ``bash`` with ``lib.sh`` and ``verify.sh`` loaded, ``nvidia-smi`` a shell
function that prints a fixture by its arguments (``__rc=N`` is its exit status), and the
driver's ``/proc/driver/nvidia/gpus`` a directory of the test (``FC_GPU_DRIVER``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import render_script
from fleetclean.engine.stages import template
from fleetclean.engine.stages.verify import (
    ECC_XID_RE,
    KERNEL_LOG_SED,
    VERIFY_Q_ARGS,
    VERIFY_Q_SECTIONS,
)
from fleetclean.engine.variables import resolve
from fleetclean.sim import nvidia_smi, smi_state

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi" / "h200"
BUS = "0000:00:06.0"
UUID = "GPU-34d59321-b75b-280a-17c6-3345f6ba227e"

DRIVER = r"""
nvidia-smi() {
    local f t
    case "$*" in
        "-q -d MEMORY,PIDS,ROW_REMAPPER") f=$FIX_Q ;;
        "-q -d MEMORY,PIDS") f=$FIX_QS ;;
        --query-gpu=*) f=$FIX_GPU ;;
        --query-compute-apps=*) f=$FIX_APPS ;;
        *) echo "unexpected nvidia-smi $*" >&2; return 2 ;;
    esac
    echo "$1${3:+ $3}" >>"$CALLS"
    t=$(<"$f")
    printf '%s' "${t%__rc=*}"
    return "${t##*__rc=}"
}
ls() { echo "ls $*" >>"$CALLS"; command ls "$@"; }
FC_VQ_SECTIONS=${SECTIONS:-$FC_VQ_SECTIONS}
fc_verify_read
printf 'mode\t%s\n' "$FC_VMODE"
printf 'rc\t%s\n' "$FC_VRC"
for i in "${!FC_VROWS[@]}"; do
    printf 'row\t%s\t%s\t%s\t%s\n' "${FC_VROWS[i]}" "${FC_VUSED[i]}" "${FC_VPEND[i]}" \
        "${FC_VMINOR[i]}"
done
fc_verify_apps
for line in "${FC_VAPPS[@]}"; do printf 'app\t%s\n' "$line"; done
FC_VOVER=()
for i in "${!FC_VROWS[@]}"; do ((FC_VUSED[i] > ${MAX:-0})) && FC_VOVER+=("$i"); done
FC_SCOPED=0
fc_verify_explain
for idx in "${!FC_VDEV[@]}"; do printf 'dev\t%s\t%s\n' "$idx" "${FC_VDEV[$idx]}"; done
"""


def driver_info(root: Path, text: str, bus: str = BUS) -> None:
    """The driver's information file for ``bus`` under ``root`` (as /proc/driver/nvidia/gpus)."""
    (root / bus).mkdir(parents=True, exist_ok=True)
    (root / bus / "information").write_text(text)


def real_info() -> str:
    """The captured /proc/driver/nvidia/gpus/0000:00:06.0/information."""
    lines = (DATA / "driver_info.txt").read_text().splitlines(keepends=True)
    return "".join(lines[1:lines.index(next(x for x in lines if x.startswith("crw")))])


# What a status script's first line leaves for the verification (render.early_reads): the
# -q read's output, then "@" and its exit status, in a pipe.
EARLY = """t=$(<"$FIX_Q")
exec {FC_VQFD}< <(printf '%s\\n@%s' "${t%__rc=*}" "${t##*__rc=}")
"""


def read(tmp: Path, q_text: str, *, gpu: str = "gpu_pending_held.txt",
         apps: str = "apps_two_held.txt", info: str | None = None,
         max_mib: int = 0, early: bool = False, sections: str = "") -> dict[str, list[str]]:
    """Run one read and the explanation of the GPUs above ``max_mib``; the output by kind,
    plus ``calls`` (nvidia-smi's first argument, with -q its sections, and the ls runs, in
    order). ``early``: the -q output waits in a pipe, as a status script's first line
    leaves it. ``sections``: the -q read's, as fc_verify_gate set them (default: all, as
    before the kernel log is read); ``q_text`` is then what -q -d MEMORY,PIDS prints."""
    drv = tmp / "drv"
    if not drv.exists():
        driver_info(drv, real_info() if info is None else info)
    (tmp / "q.txt").write_text(q_text)
    calls = tmp / "calls"
    calls.write_text("")
    script = "\n".join([template("lib.sh"), template("verify.sh"), f"FC_GPU_DRIVER={drv}",
                        EARLY if early else "", DRIVER])
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "FIX_Q": str(tmp / "q.txt"),
           "FIX_GPU": str(DATA / gpu), "FIX_APPS": str(DATA / apps), "CALLS": str(calls),
           "MAX": str(max_mib), "SECTIONS": sections, "FIX_QS": str(tmp / "q.txt")}
    return run_case(script, env, calls)


def run_case(script: str, env: dict[str, str], calls: Path) -> dict[str, list[str]]:
    """Run one case's bash: its output lines by kind (the first field), and ``calls``, the
    stub's log of nvidia-smi and ls calls."""
    out = subprocess.run(["bash", "-c", script], env=env,
                         capture_output=True, text=True, check=True, timeout=30)
    got: dict[str, list[str]] = {"calls": calls.read_text().splitlines()}
    for line in out.stdout.splitlines():
        kind, _, rest = line.partition("\t")
        got.setdefault(kind, []).append(rest)
    return got


Q_ALL = "-q MEMORY,PIDS,ROW_REMAPPER"


def real_q() -> str:
    """The captured -q of a held GPU, with page retirement as well: what the script asks
    for plus a section it must skip."""
    return (DATA / "q_mem_pids_pr_rr_held.txt").read_text()


def test_one_q_call_gives_the_rows_and_apps_the_two_csv_queries_gave(tmp_path: Path) -> None:
    got = read(tmp_path, real_q(), max_mib=60000)
    csv_row = (DATA / "gpu_pending_held.txt").read_text().splitlines()[0]
    assert got["mode"] == ["q"] and got["rc"] == ["0"]
    # index, uuid, name, used, total as --query-gpu gives them; retired pages [N/A] as the
    # CSV query says on this GPU; the device minor from the driver's file.
    assert got["row"] == [f"{csv_row.rsplit(', ', 2)[0]}\t50387\t[N/A] No\t0"]
    assert csv_row.endswith(", [N/A], No")
    apps = (DATA / "apps_two_held.txt").read_text().rpartition("__rc=")[0].splitlines()
    assert got["app"] == apps
    assert got["calls"] == [Q_ALL]  # one nvidia-smi, and no ls of the fds


def test_a_gpu_its_listed_processes_explain_is_not_looked_for_in_the_fds(tmp_path: Path) -> None:
    got = read(tmp_path, real_q(), max_mib=0)
    assert got["calls"] == [Q_ALL] and "dev" not in got


def test_memory_no_listed_process_explains_looks_for_holders_of_its_minor(
        tmp_path: Path) -> None:
    q = real_q().replace(
        "    Processes\n", "    Processes                                          : None\n")
    q = q[:q.index("        GPU instance ID")] + q[q.index("\n__rc="):]
    info = real_info().replace("Device Minor: \t 0", "Device Minor: \t 3")
    got = read(tmp_path, q, info=info)
    assert got["mode"] == ["q"] and "app" not in got
    assert got["calls"][0] == Q_ALL and got["calls"][1].startswith("ls -l /proc/")
    assert got["dev"] == ["0\t3"]  # GPU 0 is /dev/nvidia3 on this board


@pytest.mark.parametrize(("name", "damage"), [
    ("no row remapper section (MEMORY,PIDS only)",
     lambda q: (DATA / "q_mem_pids_held.txt").read_text()),
    ("[N/A] memory", lambda q: q.replace(": 50387 MiB", ": N/A", 1)),
    ("a process without its memory",
     lambda q: q.replace("            Used GPU Memory               : 8802 MiB\n", "")),
    ("process memory not a number", lambda q: q.replace(": 8802 MiB", ": N/A")),
    ("fewer GPU blocks than attached",
     lambda q: q.replace("Attached GPUs                                          : 1",
                         "Attached GPUs                                          : 2")),
    ("remapped rows N/A (a GPU that retires pages)",
     lambda q: q.replace("    Remapped Rows\n",
                         "    Remapped Rows                                      : N/A\n")),
    ("pending neither Yes nor No", lambda q: q.replace("Pending                        "
                                                       "                : No",
                                                       "Pending                        "
                                                       "                : Unknown")),
    ("an infoROM warning, exit 14",
     lambda q: "WARNING: infoROM is corrupted at gpu 0000:00:06.0\n" + q.replace(
         "__rc=0", "__rc=14")),
    ("no output, exit 0", lambda q: "__rc=0\n"),
    ("NVML failed, exit 18",
     lambda q: "Failed to initialize NVML: Driver/library version mismatch\n__rc=18\n"),
])
def test_what_the_q_read_cannot_take_goes_to_the_csv_queries(
        tmp_path: Path, name: str, damage: object) -> None:
    got = read(tmp_path, damage(real_q()), max_mib=60000)  # type: ignore[operator]
    assert got["mode"] == ["csv"], name
    assert got["calls"][0] == Q_ALL, name
    # The two CSV queries run in parallel: in either order.
    assert sorted(got["calls"][1:3]) == [
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
        "--query-gpu=index,uuid,name,memory.used,memory.total,retired_pages.pending,"
        "remapped_rows.pending"], name
    csv_row = (DATA / "gpu_pending_held.txt").read_text().splitlines()[0]
    assert got["row"] == [f"{csv_row.rsplit(', ', 2)[0]}\t50387\t[N/A] No\t"], name


def test_a_gpu_without_the_drivers_file_goes_to_the_csv_queries(tmp_path: Path) -> None:
    driver_info(tmp_path / "drv", real_info(), bus="0000:00:07.0")
    assert read(tmp_path, real_q())["mode"] == ["csv"]


def fake_q(tmp: Path, monkeypatch: pytest.MonkeyPatch, **faults: object) -> str:
    """The simulator's -q of 8 GPUs (minors reversed), one process on each, as it prints
    it; its driver files under tmp/drv."""
    bus = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    gpus = [{"index": i, "uuid": f"GPU-{i}", "bus_id": f"00000000:{b}:00.0", "minor": 7 - i}
            for i, b in enumerate(bus)]
    state = tmp / "state"
    state.mkdir()
    (state / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    (state / "pages.json").write_text(json.dumps(faults.get("pages", {})))
    monkeypatch.setattr(smi_state, "NODE_DIR", str(state))
    monkeypatch.setattr(nvidia_smi, "holders", lambda: [(i, 100 + i, 4096) for i in range(8)])
    monkeypatch.setattr(smi_state, "process_name", lambda pid: f"sglang::scheduler_TP{pid[-1]}")
    for g in gpus:
        b = str(g["bus_id"])[4:].lower()
        driver_info(tmp / "drv", f"Model: \t\t NVIDIA H200\nGPU UUID: \t {g['uuid']}\n"
                    f"Bus Location: \t {b}\nDevice Minor: \t {g['minor']}\n", bus=b)
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS,ROW_REMAPPER"])
    return f"{text}__rc={status}\n"


def test_the_simulators_eight_gpus_read_in_index_order_with_their_minors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(tmp_path, fake_q(tmp_path, monkeypatch, pages={"remapped": [5]}), max_mib=0)
    assert got["mode"] == ["q"]
    assert got["row"] == [f"{i}, GPU-{i}, NVIDIA H200, 4096, 143771\t4096\t[N/A] "
                          f"{'Yes' if i == 5 else 'No'}\t{7 - i}" for i in range(8)]
    assert got["app"] == [f"{100 + i}, sglang::scheduler_TP{i}, 4096, GPU-{i}" for i in range(8)]
    assert got["calls"] == [Q_ALL]


def test_the_simulators_retired_pages_go_to_the_csv_queries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(tmp_path, fake_q(tmp_path, monkeypatch, pages={"retired": [2]}))
    assert got["mode"] == ["csv"]


@pytest.mark.parametrize(("name", "used", "apps"), [
    ("q_mem_pids_rr_held.txt", "50387", [("4168", "41570"), ("4216", "8802")]),
    ("q_mem_pids_rr_idle.txt", "0", []),
])
def test_the_exact_read_captured_on_the_h200_is_taken_in_one_call(
        tmp_path: Path, name: str, used: str, apps: list[tuple[str, str]]) -> None:
    got = read(tmp_path, (DATA / name).read_text(), max_mib=60000)
    assert got["mode"] == ["q"] and got["rc"] == ["0"]
    assert [row.split("\t")[1:3] for row in got["row"]] == [[used, "[N/A] No"]]
    assert [(a.split(", ")[0], a.split(", ")[2]) for a in got.get("app", [])] == apps
    assert got["calls"] == [Q_ALL]


@pytest.mark.parametrize("source", ["h200", "simulator"])
def test_the_read_a_status_script_started_early_gives_what_the_call_gave(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    q = real_q() if source == "h200" else fake_q(tmp_path, monkeypatch)
    called = read(tmp_path, q, max_mib=0)
    early = read(tmp_path, q, max_mib=0, early=True)
    assert called["calls"] == [Q_ALL] and early["calls"] == []  # no second nvidia-smi
    assert early["mode"] == ["q"] and early["row"] and early["app"]
    assert {k: v for k, v in early.items() if k != "calls"} == {
        k: v for k, v in called.items() if k != "calls"}


def test_an_early_read_that_failed_goes_to_the_csv_queries(tmp_path: Path) -> None:
    failed = "Failed to initialize NVML: Driver/library version mismatch\n__rc=18\n"
    got = read(tmp_path, failed, max_mib=60000, early=True)
    assert got["mode"] == ["csv"] and got["rc"] == ["0"]
    assert sorted(got["calls"]) == [
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
        "--query-gpu=index,uuid,name,memory.used,memory.total,retired_pages.pending,"
        "remapped_rows.pending"]


def test_a_pipe_is_read_in_blocks_not_a_byte_per_system_call() -> None:
    # A real node's kernel log is 100-250 KB: `read -d ''` took one read(2) per byte.
    script = "\n".join([template("lib.sh"), r"""
exec {fd}< <(head -c 300000 /dev/zero | tr '\0' x; printf '\nlast line\n')
syscr() { local k v; while read -r k v; do [[ $k == syscr: ]] && n=$v; done </proc/$BASHPID/io; }
syscr; before=$n
fc_read_fd "$fd"
syscr; after=$n
echo "${#REPLY} $((after - before)) ${REPLY: -11}"
"""])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    length, reads, tail = out.stdout.split(maxsplit=2)
    assert int(length) == 300011 and tail.strip() == "last line"
    assert int(reads) < 1000, f"{reads} read(2) calls for 300 KB"


def test_the_early_read_is_the_verifications_own_and_only_a_status_script_has_it() -> None:
    verify = template("verify.sh")
    assert 'fc_smi -q -d "$FC_VQ_SECTIONS"' in verify
    assert all(f"FC_VQ_SECTIONS={s}\n" in verify for s in VERIFY_Q_SECTIONS)
    assert f"FC_VECC_RE='{ECC_XID_RE}'\n" in verify
    assert f"FC_VKLOG_SED='{KERNEL_LOG_SED}'\n" in verify
    assert f"-q -d {VERIFY_Q_SECTIONS[0]}" == VERIFY_Q_ARGS
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n")
    teardown = render_script(resolve(load_playbook("post-extraction"), {}, {}), host_name="n")
    # The GPU read, then the kernel log's, each a line before the one that reads the rest.
    gpu, klog, first = status.splitlines()[3:6]
    assert f"nvidia-smi {VERIFY_Q_ARGS}" in gpu and "FC_VQFD" in gpu
    assert "read -r -N" not in gpu + klog and "read -r -N" in first
    assert f"dmesg 2>/dev/null </dev/null | sed -n '{KERNEL_LOG_SED}'" in klog
    head = teardown.split("\n# fleetclean ", 1)[0]  # the lines before the header
    assert "read -r -N" in head.splitlines()[-1]
    assert "FC_VQFD" not in head and "FC_VXIDFD" not in head


BOOT = "[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)\n"
XID = "[ 5342.118207] NVRM: Xid (PCI:0000:2a:00): {}, pid='<unknown>', name=<unknown>, text\n"
NOISE = "[    2.500000] pci 0000:2a:00.0: BAR 0 [mem 0x2a000000-0x2affffff 64bit pref]\n"


# The same log as the kernel keeps it (dmesg -r): the banner at notice, the rest of the boot
# at info, the driver's Xids at the kernel's default level (4, warn) or at err.
RECORDS = ("<5>" + BOOT + ("<6>" + NOISE) * 1000 + "<4>" + XID.format(13) + "<6>" + NOISE
           + "<3>" + XID.format(79) + "<6>" + NOISE)
UTIL_LINUX = shutil.which("dmesg", path="/usr/bin:/bin:/usr/sbin:/sbin")


@pytest.mark.parametrize(("dmesg", "sed", "printk"), [
    ("util-linux", False, "4\t4\t1\t7"),  # dmesg formats the Xids' levels only: no sed
    ("busybox", True, "4\t4\t1\t7"),  # no -l: sed passes the first line and Xids on
    ("busybox", False, "4\t4\t1\t7"),  # neither: the log whole
    # The default level changed to debug: an Xid is logged at 7, so every level is read.
    ("util-linux", True, "4\t7\t1\t7"),
])
def test_bash_reads_only_the_kernel_logs_first_line_and_its_xid_lines(
        tmp_path: Path, dmesg: str, sed: bool, printk: str) -> None:
    """A real boot log is 100-250 KB, nearly all of it info: formatting it costs dmesg 5 ms
    of CPU a status, and bash's read loops over every byte that reaches it. Both ways the
    kernel log is started (the verification's, a status script's first line) have dmesg
    print only the levels an Xid and the banner are logged at (its ``-l``, where the
    kernel's default level in /proc/sys/kernel/printk is among them), or else pass on the
    first line and Xid lines through sed; a node with neither (busybox without sed) gives
    it whole. The printk file is the test's, bound over the real one in a mount namespace
    of its own."""
    unshare = shutil.which("unshare")
    if UTIL_LINUX is None or unshare is None:
        pytest.skip("needs util-linux's dmesg and unshare")
    level = printk.split("\t")[1]
    records = RECORDS.replace("<4>[ 5342", f"<{level}>[ 5342")
    (tmp_path / "log").write_text(records)
    (tmp_path / "printk").write_text(printk + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if dmesg == "util-linux":
        fake = f'exec {UTIL_LINUX} -F {tmp_path / "log"} "$@"\n'
    else:  # busybox's dmesg knows no -l
        fake = (f'[ "$1" = -l ] && exit 1\nexec {shutil.which("sed")} "s/^<[0-9]*>//" '
                f'{tmp_path / "log"}\n')
    (bin_dir / "dmesg").write_text(f"#!/bin/sh\n{fake}")
    (bin_dir / "dmesg").chmod(0o755)
    if sed:
        (bin_dir / "sed").symlink_to(shutil.which("sed") or "/bin/sed")
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n")
    early = status.splitlines()[4]  # after the shebang, the directive, POSIX mode, the GPU
    assert early.startswith("[[ -n ${FC_VXIDFD:-} && ${FC_VXIDFD@a} != *x* ]] || {")
    early = re.sub(r"PATH=\$PATH:[^;]*;", "PATH=$PATH;", early)  # this PATH alone
    script = "\n".join([
        f"/bin/mount --bind {tmp_path / 'printk'} /proc/sys/kernel/printk || exit 9",
        template("lib.sh"), template("verify.sh"), r"""
exec {FC_VXIDFD}< <(fc_verify_klog)
fc_read_fd "$FC_VXIDFD"
printf '%s\n---\n' "$REPLY"
exec {FC_VXIDFD}<&-
FC_VXIDFD=""
""", early, r"""
fc_read_fd "$FC_VXIDFD"
printf '%s' "$REPLY"
"""])
    out = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "/bin/bash", "-c", script],
        capture_output=True, text=True, check=True, timeout=30,
        env={"PATH": str(bin_dir), "LC_ALL": "C"})
    whole = re.sub(r"(?m)^<\d>", "", records)
    want = whole if dmesg == "busybox" and not sed else BOOT + XID.format(13) + XID.format(79)
    assert out.stdout == f"{want}\n---\n{want}"


@pytest.mark.parametrize(("log", "sections"), [
    (BOOT + "[    1.2] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n", "MEMORY,PIDS"),
    # An application's fault (an illegal address, a page fault) marks no row for remapping.
    (BOOT + XID.format(13) + XID.format(31) + XID.format(43), "MEMORY,PIDS"),
    (BOOT + XID.format(13) + XID.format(63), "MEMORY,PIDS,ROW_REMAPPER"),
    (BOOT + XID.format(94), "MEMORY,PIDS,ROW_REMAPPER"),
    (BOOT + XID.format(48), "MEMORY,PIDS,ROW_REMAPPER"),
    (BOOT + XID.format(154), "MEMORY,PIDS,ROW_REMAPPER"),  # a reset required (R550 on)
    # Older drivers name the GPU without "PCI:".
    (BOOT + XID.format(63).replace("(PCI:", "("), "MEMORY,PIDS,ROW_REMAPPER"),
    # Not whole since boot: cleared (dmesg -C) or wrapped, an Xid 63 may have gone with it.
    ("[86400.000001] eth0: link up\n", "MEMORY,PIDS,ROW_REMAPPER"),
    ("", "MEMORY,PIDS,ROW_REMAPPER"),  # unreadable (dmesg_restrict, no root)
    # "630" and "163" are other Xids than 63.
    (BOOT + XID.format(630) + XID.format(163), "MEMORY,PIDS"),
    # An ECC Xid deep in a big log still reaches bash through the filter.
    (BOOT + NOISE * 1000 + XID.format(94), "MEMORY,PIDS,ROW_REMAPPER"),
])
@pytest.mark.parametrize("through", ["sed", "whole"])  # a node without sed gets it whole
def test_the_row_remapper_is_read_unless_the_kernel_log_rules_a_pending_remap_out(
        log: str, sections: str, through: str) -> None:
    feed = "printf '%s' \"$LOG\""
    if through == "sed":
        feed += " | sed -n \"$FC_VKLOG_SED\""
    script = "\n".join([template("lib.sh"), template("verify.sh"),
                         f"exec {{FC_VXIDFD}}< <({feed})", r"""fc_verify_xid_text
echo "$FC_VQ_SECTIONS"
"""])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LOG": log})
    assert out.stdout.strip() == sections


def test_a_read_without_the_remapper_takes_the_h200s_memory_and_processes(
        tmp_path: Path) -> None:
    q = (DATA / "q_mem_pids_held.txt").read_text()
    got = read(tmp_path, q, max_mib=60000, sections="MEMORY,PIDS")
    assert got["mode"] == ["q"] and got["calls"] == ["-q MEMORY,PIDS"]
    full = read(tmp_path, real_q(), max_mib=60000)
    assert got["row"] == full["row"] and got["app"] == full["app"]
    assert got["row"][0].split("\t")[2] == "[N/A] No"


def test_a_failed_early_read_still_reads_and_closes_the_remappers_pipe() -> None:
    # nvidia-smi failed (a lost GPU): the remapper's call, started beside it, is read and
    # its pipe closed too, or it would run on unread and hold the session open.
    script = "\n".join([template("lib.sh"), template("verify.sh"), r"""
exec {FC_VQFD}< <(printf 'Unable to determine the device handle for GPU0000:18:00.0\n@15')
exec {FC_VRRFD}< <(printf 'Attached GPUs : 8\n@0')
rr=$FC_VRRFD
fc_verify_read_q
echo "rc=$? left=${FC_VQFD:-}${FC_VRRFD:-}"
if [[ -e /proc/$BASHPID/fd/$rr ]]; then echo open; else echo closed; fi
"""])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    assert out.stdout.split() == ["rc=1", "left=", "closed"]


# A host whose GPUs all read clean last time (results/lastclean.py): its status script's
# first line started --query-gpu (FC_VGFD) and, where the kernel log cannot rule a pending
# remap out, the pending fields beside it (FC_VRRFD); the apps are asked for only where a
# GPU is in use (the harness explains only the GPUs above MAX).
GPUS_DRIVER = DRIVER.replace(
    'fc_verify_apps\nfor line in "${FC_VAPPS[@]}"; do printf \'app\\t%s\\n\' "$line"; done\n',
    "").replace("fc_verify_explain\n", "((${#FC_VOVER[@]} == 0)) || fc_verify_explain\n"
                'for line in "${FC_VAPPS[@]}"; do printf \'app\\t%s\\n\' "$line"; done\n')
GPUS_EARLY = """t=$(<"$FIX_G")
exec {FC_VGFD}< <(printf '%s\\n@%s' "${t%__rc=*}" "${t##*__rc=}")
if [[ -n $FIX_RR ]]; then
    t=$(<"$FIX_RR")
    exec {FC_VRRFD}< <(printf '%s\\n@%s' "${t%__rc=*}" "${t##*__rc=}")
fi
"""
APPS_CALL = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"


def real_gpus(used: str = "50387") -> str:
    """The captured --query-gpu line of the H200 (its first five fields: what
    --query-gpu=index,uuid,name,memory.used,memory.total prints), memory.used ``used``."""
    fields = (DATA / "gpu_pending_held.txt").read_text().splitlines()[0].split(", ")[:5]
    fields[3] = used
    return ", ".join(fields) + "\n__rc=0\n"


def read_gpus(tmp: Path, gpus: str, *, pending: str | None = None, max_mib: int = 0,
              apps: str = "apps_two_held.txt", info: str | None = None,
              q_text: str = "") -> dict[str, list[str]]:
    """``read`` for a host seen clean: ``gpus`` what the early --query-gpu printed (then
    __rc=N), ``pending`` what the pending fields' query printed (None: not asked)."""
    drv = tmp / "drv"
    if not drv.exists():
        driver_info(drv, real_info() if info is None else info)
    (tmp / "g.txt").write_text(gpus)
    (tmp / "rr.txt").write_text(pending or "")
    (tmp / "q.txt").write_text(q_text or real_q())
    calls = tmp / "calls"
    calls.write_text("")
    script = "\n".join([template("lib.sh"), template("verify.sh"), f"FC_GPU_DRIVER={drv}",
                        GPUS_EARLY, GPUS_DRIVER])
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "FIX_Q": str(tmp / "q.txt"),
           "FIX_QS": str(tmp / "q.txt"), "FIX_GPU": str(DATA / "gpu_pending_held.txt"),
           "FIX_APPS": str(DATA / apps), "CALLS": str(calls), "MAX": str(max_mib),
           "SECTIONS": "", "FIX_G": str(tmp / "g.txt"),
           "FIX_RR": str(tmp / "rr.txt") if pending is not None else ""}
    return run_case(script, env, calls)


def test_a_clean_host_seen_clean_reads_its_gpus_in_one_query_and_nothing_else(
        tmp_path: Path) -> None:
    got = read_gpus(tmp_path, real_gpus("0"))
    with_q = read(tmp_path / "q", (DATA / "q_mem_pids_rr_idle.txt").read_text(), max_mib=0)
    assert got["mode"] == ["q"] and got["rc"] == ["0"]
    # The row the -q read gives, but for the device minor, which no one needed.
    assert [r.rsplit("\t", 1)[0] for r in got["row"]] == [
        r.rsplit("\t", 1)[0] for r in with_q["row"]]
    assert got["row"][0].endswith("\t")
    assert got["calls"] == [] and "app" not in got and "dev" not in got


def test_a_host_seen_clean_and_now_in_use_asks_for_its_apps_after_the_query(
        tmp_path: Path) -> None:
    got = read_gpus(tmp_path, real_gpus())
    with_q = read(tmp_path / "q", real_q(), max_mib=0)
    assert got["calls"] == [APPS_CALL]  # the apps explain the GPU: no ls of the fds
    assert got["app"] == with_q["app"] and len(got["app"]) == 2
    assert "dev" not in got


def test_memory_no_app_explains_on_a_host_seen_clean_looks_for_holders_of_its_minor(
        tmp_path: Path) -> None:
    info = real_info().replace("Device Minor: \t 0", "Device Minor: \t 3")
    got = read_gpus(tmp_path, real_gpus(), apps="apps_empty.txt", info=info)
    assert got["calls"][0] == APPS_CALL and got["calls"][1].startswith("ls -l /proc/")
    assert got["dev"] == ["0\t3"]  # the minor of the driver's file with the row's uuid


def test_a_pending_remap_on_a_host_seen_clean_comes_from_the_query_beside(
        tmp_path: Path) -> None:
    got = read_gpus(tmp_path, real_gpus("0"), pending="0, [N/A], Yes\n__rc=0\n")
    assert got["mode"] == ["q"] and got["row"][0].split("\t")[2] == "[N/A] Yes"
    assert got["calls"] == []


@pytest.mark.parametrize(("name", "gpus", "pending"), [
    ("an infoROM warning, exit 14",
     "WARNING: infoROM is corrupted at gpu 0000:00:06.0\n" + real_gpus().replace(
         "__rc=0", "__rc=14"), None),
    ("[N/A] memory", real_gpus("[N/A]"), None),
    ("no output, exit 0", "__rc=0\n", None),
    ("NVML failed, exit 18",
     "Failed to initialize NVML: Driver/library version mismatch\n__rc=18\n", None),
    ("a field missing", real_gpus().replace(", 143771", ""), None),
    ("the pending query failed", real_gpus(), "Field \"remapped_rows.pending\" is not a "
     "valid field to query.\n\n__rc=2\n"),
    ("the pending query without the GPU", real_gpus(), "1, [N/A], No\n__rc=0\n"),
    ("the pending query empty", real_gpus(), "__rc=0\n"),
])
def test_what_the_query_of_a_host_seen_clean_cannot_take_goes_to_the_csv_queries(
        tmp_path: Path, name: str, gpus: str, pending: str | None) -> None:
    got = read_gpus(tmp_path, gpus, pending=pending, max_mib=0)
    # No -q call in between: what the query could not take, -q would not either.
    assert got["mode"] == ["csv"], name
    assert sorted(got["calls"][:2]) == [
        APPS_CALL, "--query-gpu=index,uuid,name,memory.used,memory.total,"
        "retired_pages.pending,remapped_rows.pending"], name
    csv_row = (DATA / "gpu_pending_held.txt").read_text().splitlines()[0]
    assert got["row"] == [f"{csv_row.rsplit(', ', 2)[0]}\t50387\t[N/A] No\t"], name
    apps = (DATA / "apps_two_held.txt").read_text().rpartition("__rc=")[0].splitlines()
    assert got["app"] == apps, name  # the CSV read's own apps, not a query left pending


def test_the_minor_of_each_gpu_seen_clean_is_the_one_of_its_uuid(tmp_path: Path) -> None:
    """Two GPUs whose driver files list them in the other order, minors 5 and 4: each
    unexplained GPU's device file is found by its uuid, not by its place."""
    drv = tmp_path / "drv"
    for bus, uuid, minor in (("0000:18:00.0", "GPU-bbb", 5), ("0000:2a:00.0", "GPU-aaa", 4)):
        driver_info(drv, f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\n"
                    f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\n", bus=bus)
    gpus = ("0, GPU-aaa, NVIDIA H200, 1500, 143771\n1, GPU-bbb, NVIDIA H200, 900, 143771\n"
            "__rc=0\n")
    got = read_gpus(tmp_path, gpus, apps="apps_empty.txt")
    assert sorted(got["dev"]) == ["0\t4", "1\t5"]
    assert got["calls"][0] == APPS_CALL and got["calls"][1].startswith("ls -l /proc/")


def test_a_gpu_name_with_commas_and_pending_fields_out_of_order_read_as_they_are(
        tmp_path: Path) -> None:
    gpus = ("0, GPU-aaa, NVIDIA A100, PCIe, 80GB, 0, 81920\n"
            "1, GPU-bbb, NVIDIA A100, PCIe, 80GB, 0, 81920\n__rc=0\n")
    got = read_gpus(tmp_path, gpus, pending="1, No, Yes\n0, No, No\n__rc=0\n")
    assert got["mode"] == ["q"] and got["calls"] == []
    assert got["row"] == ["0, GPU-aaa, NVIDIA A100, PCIe, 80GB, 0, 81920\t0\tNo No\t",
                          "1, GPU-bbb, NVIDIA A100, PCIe, 80GB, 0, 81920\t0\tNo Yes\t"]


def test_an_exported_descriptor_is_a_strangers_and_is_never_read(tmp_path: Path) -> None:
    """A FC_VGFD from the environment (another program's descriptor) is neither read nor
    closed by the verification; the host is read with -q, as one never seen."""
    drv = tmp_path / "drv"
    driver_info(drv, real_info())
    (tmp_path / "q.txt").write_text((DATA / "q_mem_pids_rr_idle.txt").read_text())
    (tmp_path / "theirs").write_text("their data\n")
    calls = tmp_path / "calls"
    calls.write_text("")
    script = "\n".join([
        template("lib.sh"), template("verify.sh"), f"FC_GPU_DRIVER={drv}",
        'exec 7<"$THEIRS"; export FC_VGFD=7',
        "opt_max_used_mib=0 opt_timeout_ms=0 opt_interval_s=1 opt_interval_ms=1000",
        "opt_settle_ms=0 opt_leak_quiet_ms=0 FC_CHECK=1",
        DRIVER.split("FC_VQ_SECTIONS=", maxsplit=1)[0],  # the nvidia-smi stub
        "dmesg() { :; }",  # no kernel log: nothing rules a pending remap out
        "fc_verify >/dev/null",
        'read -r line <&7 && printf "theirs\t%s\n" "$line"'])
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "FIX_Q": str(tmp_path / "q.txt"),
           "FIX_QS": str(tmp_path / "q.txt"), "FIX_GPU": str(DATA / "gpu_pending_held.txt"),
           "FIX_APPS": str(DATA / "apps_empty.txt"), "CALLS": str(calls),
           "THEIRS": str(tmp_path / "theirs")}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         timeout=30, check=False)
    assert "theirs\ttheir data" in out.stdout, out.stdout + out.stderr
    assert calls.read_text().splitlines()[0] == Q_ALL


# Rows as --query-gpu prints them, and ones it never should: each must read as the
# anchored pattern reads it (fields or no match), which is what the script used before.
ROWS = [
    "0, GPU-34d59321-b75b-280a-17c6-3345f6ba227e, NVIDIA H200, 0, 143771",
    "7, GPU-x, NVIDIA H200, 50387, 143771",
    "3, GPU-x, Tesla, V100, SXM2, 16GB, 12, 16160",  # a name with commas
    "3, GPU-x, A, 5, 6, 7",
    "12, GPU-a-b, N, 0, 1",
    "0, GPU-x, , 5, 6", "0, GPU-x, 5, 6", "0,GPU-x, N, 5, 6", "0, GPU-, N, 5, 6",
    "0, GPU-a,b, N, 5, 6", "0, GPU-x, N, [N/A], 6", "0, GPU-x, N, 5, ", "0, GPU-x, N, 5,6",
    "x0, GPU-x, N, 5, 6", ", GPU-x, N, 5, 6", "0, UUID-x, N, 5, 6", "0, GPU-x, N, -5, 6",
    "0, GPU-x, N, 5, 6 ", " 0, GPU-x, N, 5, 6", "0, GPU-x, N, , 5, 6", "0, GPU-x, N,, 5, 6",
    "0, GPU-x, N, 5, 6, ", "0, GPU-x, N, 5 , 6", "0, GPU-x, Ünï, 5, 6", "0, GPU-x, N * ?, 5, 6",
]


def test_a_gpu_row_is_read_as_the_anchored_pattern_reads_it() -> None:
    script = template("verify.sh") + r"""
re='^([0-9]+), (GPU-[^,]+), (.+), ([0-9]+), ([0-9]+)$'
while IFS= read -r line; do
    if [[ $line =~ $re ]]; then want="${BASH_REMATCH[*]:1}"; else want=no; fi
    if fc_verify_gpu_row "$line"; then got="${FC_VROW[*]}"; else got=no; fi
    printf '%s\t%s\t%s\n' "$line" "$want" "$got"
done
"""
    out = subprocess.run(["bash", "-c", script], input="\n".join(ROWS) + "\n", text=True,
                         capture_output=True, check=True, env={"LC_ALL": "C"}).stdout
    seen = [line.split("\t") for line in out.splitlines()]
    assert [row for row, _, _ in seen] == ROWS
    assert [(row, got) for row, _, got in seen] == [(row, want) for row, want, _ in seen]
    got = {row: got for row, _, got in seen}
    assert got[ROWS[2]] == "3 GPU-x Tesla, V100, SXM2, 16GB 12 16160"
    assert got[ROWS[5]] == "no" and got["0, GPU-x, N, 5, 6 "] == "no"


@pytest.mark.parametrize("tap", [0, 1])
def test_records_written_together_are_the_records_written_one_by_one(tap: int) -> None:
    rows = ["0, GPU-a, N, 0, 1", "1, GPU-b, 50% off\tname, 0, 1", "", "2, GPU-c, N, 0, 1"]
    script = template("lib.sh") + f"""
fc_tap() {{ echo "tap $2 $3"; }}
FC_TAP={tap}
rows=("$@")
fc_rec_each gpu "${{rows[@]}}"; echo ---
for r in "${{rows[@]}}"; do fc_rec gpu "$r"; done; echo ---
fc_rec_each gpu "${{rows[0]}}" "${{rows[3]}}"; echo ---
for r in "${{rows[0]}}" "${{rows[3]}}"; do fc_rec gpu "$r"; done; echo ---
fc_hold; fc_rec_each gpu "${{rows[0]}}"; fc_rec_each gpu; echo held; fc_release; echo ---
fc_rec_each 'k%d\\n' a b; fc_rec 'k%d\\n' a; fc_rec 'k%d\\n' b; echo ---
fc_rec_each 'k\\n' a b; fc_rec 'k\\n' a; fc_rec 'k\\n' b
"""
    out = subprocess.run(["bash", "-c", script, "x", *rows], text=True, capture_output=True,
                         check=True, env={"LC_ALL": "C"}).stdout
    all_each, all_one, clean_each, clean_one, held, odd_kind, backslash = out.split("---\n")
    # A kind with a % or a backslash is written as fc_rec writes it, not as a format.
    for text in (odd_kind, backslash):
        lines = text.splitlines()
        assert lines[:len(lines) // 2] == lines[len(lines) // 2:] and len(lines) == 4 + 4 * tap
    assert all_each == all_one and "50%25 off%09name" in all_one
    assert clean_each == clean_one and clean_one.count("@@fleetclean\tgpu\t") == 2
    # Held, the record leaves with the release (none for no row); tapped, it is also logged
    # at once, as fc_rec's.
    record = "@@fleetclean\tgpu\t0, GPU-a, N, 0, 1\n"
    assert held == "tap gpu 0, GPU-a, N, 0, 1\n" * tap + "held\n" + record


# Driver files as /proc/driver/nvidia/gpus/*/information has them, and damaged ones: each
# must read as the three anchored patterns the script used before read it.
INFOS = [
    "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-34d5\nDevice Minor: \t 0\n",
    "Model: NVIDIA H100 80GB HBM3\nIRQ: 1\nGPU UUID: GPU-x\nBus Location: 0\nDevice Minor: 17",
    "Model: \t A, B\nGPU UUID: \t GPU-x\nDevice Minor: \t 3 \t\nGPU Excluded:\t No\n",
    "GPU UUID: GPU-x\nDevice Minor: 0\n", "Model: N\nDevice Minor: 0\n",
    "Model: N\nGPU UUID: GPU-x\n", "Model: N\nGPU UUID: GPU-x\nDevice Minor: x1\n",
    "Model: N\nGPU UUID: \t \nDevice Minor: 1\n", "Model:\nGPU UUID: GPU-x\nDevice Minor: 1\n",
    "Model: N\nGPU UUID: GPU-x\nDevice Minor: 1 2\n",
    "XModel: N\nGPU UUID: GPU-x\nDevice Minor: 1\n",
    "",
]


def test_a_drivers_file_is_read_as_the_anchored_patterns_read_it(tmp_path: Path) -> None:
    for i, text in enumerate(INFOS):
        driver_info(tmp_path, text, bus=f"0000:00:{i:02x}.0")
    script = template("lib.sh") + r"""
old() {
    local text="" uuid name minor
    { IFS= read -r -N 65536 text <"$FC_GPU_DRIVER/$1/information"; } 2>/dev/null
    text=$'\n'$text
    [[ $text =~ $'\n'"Model:"[[:blank:]]*([^$'\n']*) ]] || return 1
    name=${BASH_REMATCH[1]}
    [[ $text =~ $'\n'"GPU UUID:"[[:blank:]]*([^$'\n']*) ]] || return 1
    uuid=${BASH_REMATCH[1]}
    [[ $text =~ $'\n'"Device Minor:"[[:blank:]]*([0-9]+)[[:blank:]]*($'\n'|$) ]] || return 1
    minor=${BASH_REMATCH[1]}
    [[ -n $uuid && -n $name ]] || return 1
    REPLY="$minor $uuid, $name"
}
FC_GPU_DRIVER=$DRV
for dir in "$FC_GPU_DRIVER"/*/; do
    bus=${dir%/} bus=${bus##*/}
    if old "$bus"; then want=$REPLY; else want=no; fi
    if fc_gpu_info_load "$bus"; then got=${FC_GPU_INFO[$bus]}; else got=no; fi
    printf '%s\t%s\t%s\n' "$bus" "$want" "$got"
done
"""
    out = subprocess.run(["bash", "-c", script], text=True, capture_output=True, check=True,
                         env={"LC_ALL": "C", "DRV": str(tmp_path)}).stdout
    seen = [line.split("\t") for line in out.splitlines()]
    assert len(seen) == len(INFOS)
    assert [got for _, _, got in seen] == [want.rstrip(" \t") for _, want, _ in seen]
    assert [got for _, _, got in seen[:3]] == [
        "0 GPU-34d5, NVIDIA H200", "17 GPU-x, NVIDIA H100 80GB HBM3", "3 GPU-x, A, B"]


def apps_pairs(lines: list[str]) -> list[tuple[str, str]]:
    """``fc_apps_pairs`` (lib.sh) on these lines of a compute-apps CSV: (PID, UUID) each."""
    script = "\n".join([template("lib.sh"), r"""
mapfile -t lines <"$1"
fc_apps_pairs "${lines[@]}"
for i in "${!FC_APP_PID[@]}"; do printf '%s %s\n' "${FC_APP_PID[i]}" "${FC_APP_UUID[i]}"; done
"""])
    text = "".join(f"{line}\n" for line in lines)
    out = subprocess.run(["bash", "-c", script, "bash", "/dev/stdin"], input=text,
                         capture_output=True, text=True, check=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    return [(pid, uuid) for pid, uuid in (line.split() for line in out.stdout.splitlines())]


def test_one_parser_reads_every_form_of_the_compute_apps_list() -> None:
    # The H200's own list (pid, name, MiB, UUID), then the name-less reads a teardown and a
    # scope make (gpu-holders.sh, scope.sh), in the list's order.
    captured = (DATA / "apps_two_held.txt").read_text().split("__rc=")[0].splitlines()
    other = "GPU-fa529bc3-df9c-8e3c-22fb-c95e99d1c9dc"
    assert apps_pairs([*captured, f"77, 1024, {other}", f"78, {other}"]) == [
        ("496", UUID), ("559", UUID), ("77", other), ("78", other)]


def test_a_name_that_cuts_its_line_in_two_lists_nobody_and_commas_in_one_are_kept() -> None:
    # nvidia-smi prints argv[0] as it is: a comma and a newline in it make two lines, neither
    # of which names a process (an empty key would end the script); commas alone do not.
    assert apps_pairs([
        "901, evil,", "x, 512, " + UUID,          # one line cut in two by a name
        "902, a, b, c, 1024, " + UUID,             # a name with commas
        "903, python3, 1024, [N/A]", "",           # no UUID, an empty line
    ]) == [("902", UUID)]



def info_text(uuid: str, minor: int) -> str:
    return f"Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-{uuid}\nDevice Minor: \t {minor}\n"


def gpu_map(drv: Path, smi: str) -> str:
    """scope.sh's fc_gpu_map with nvidia-smi printing ``smi``: minor -> index, or why not."""
    script = "\n".join([template("lib.sh"), template("scope.sh"), f"FC_GPU_DRIVER={drv}", r"""
nvidia-smi() { printf '%s\n' "$SMI"; }
if fc_gpu_map; then
    for m in "${!FC_GPU_INDEX_OF_MINOR[@]}"; do echo "$m ${FC_GPU_INDEX_OF_MINOR[$m]}"; done
else
    echo "failed: $REPLY"
fi
"""])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SMI": smi})
    return "".join(sorted(out.stdout.splitlines(keepends=True))).replace(str(drv), "DRV")


def test_a_gpu_in_a_pci_domain_past_ffff_is_found_under_its_own_driver_directory(
    tmp_path: Path,
) -> None:
    # nvidia-smi prints the domain in 8 digits, the driver names its directory with at
    # least 4: domain 0x10000 (VMD) is 10000:01:00.0, not domain 0's 0000:01:00.0.
    driver_info(tmp_path, info_text("d0", 3), bus="0000:01:00.0")
    driver_info(tmp_path, info_text("d1", 5), bus="10000:01:00.0")
    smi = "0, GPU-d0, 00000000:01:00.0\n1, GPU-d1, 00010000:01:00.0"
    assert gpu_map(tmp_path, smi) == "3 0\n5 1\n"
    script = "\n".join([template("lib.sh"), template("verify.sh"), f"FC_GPU_DRIVER={tmp_path}",
                        'fc_verify_gpu_info 00010000:01:00.0 && echo "$FC_VGPU_MINOR $REPLY"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout
    assert out == "5 GPU-d1, NVIDIA H200\n"


def test_a_scope_refuses_a_driver_file_of_another_gpu(tmp_path: Path) -> None:
    # Its minor would put another GPU's (another job's) processes in the scope.
    driver_info(tmp_path, info_text("d0", 3), bus="0000:01:00.0")
    driver_info(tmp_path, info_text("d9", 4), bus="0000:02:00.0")
    smi = "0, GPU-d0, 00000000:01:00.0\n1, GPU-d1, 00000000:02:00.0"
    assert gpu_map(tmp_path, smi) == (
        "failed: cannot tell which /dev/nvidiaN is GPU 1: DRV/0000:02:00.0/information is not "
        "GPU GPU-d1's\n")


def test_a_minor_is_looked_up_in_every_drivers_file_when_only_some_were_read(
    tmp_path: Path,
) -> None:
    # A -q read that failed part way had read GPU0's file alone; the CSV read then asks for
    # GPU1's minor, which is not its index.
    driver_info(tmp_path, info_text("d0", 1), bus="0000:01:00.0")
    driver_info(tmp_path, info_text("d1", 0), bus="0000:02:00.0")
    script = "\n".join([template("lib.sh"), template("verify.sh"), f"FC_GPU_DRIVER={tmp_path}",
                        "fc_verify_gpu_info 00000000:01:00.0",
                        'fc_minor_of_uuid GPU-d1 && echo "minor $REPLY"',
                        'fc_minor_of_uuid GPU-none || echo "none"'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}).stdout
    assert out == "minor 0\nnone\n"


def test_a_reads_name_less_list_is_read_once_and_keeps_each_processs_memory(
    tmp_path: Path,
) -> None:
    # Where a name holds a newline, the explanation and the report of one GPU read took
    # the list again without names each: one call a read now, and the records keep the
    # memory of each process from it (fc_apps_pairs' FC_APP_MIB).
    calls = tmp_path / "calls"
    script = "\n".join([template("lib.sh"), template("verify.sh"), r"""
nvidia-smi() { echo "$*" >>"$CALLS"; printf '%s\n' "5, 1024, GPU-a" "6, [N/A], GPU-a"; }
FC_ARGV0[5]=$'/opt/x\ny' FC_VREADS=1
fc_apps_trusted
fc_verify_apps_named
printf '%s\n' "${FC_NAPPS[@]}"
FC_VREADS=2
fc_apps_trusted
"""])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C",
                                          "CALLS": str(calls)}).stdout
    assert out == "5, x?y, 1024, GPU-a\n"
    assert len(calls.read_text().splitlines()) == 2  # reads 1 and 2, not 3
