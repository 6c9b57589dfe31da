"""True diagnosis over SSH on nodes that behave like real ones (issue #12 items 1, 2, 6):
who holds a dirty GPU, driver-level leaks ended by their own rule, faulty GPUs.

Every node runs nvidia-persistenced holding every GPU, as on a datacenter node (the
simulator's default), and an NVML monitoring agent holds every GPU too where a test
starts one. One fleet serves the module; each test leaves its node idle.
"""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path

import pytest
from simhelp import Cli, alive, edit_inventory, uvm_counted

from fleetclean.cli import Env, main
from fleetclean.sim import SimFleet, uvm_count

pytestmark = pytest.mark.sim




def daemon(fleet: SimFleet) -> int:
    pid = fleet.persistenced_pid("node01")
    assert pid is not None
    return pid


def test_the_reason_names_the_workers_and_not_persistenced(fleet: SimFleet, cli: Cli) -> None:
    _, worker0, worker1, *_ = fleet.spawn("node01", "sglang", gpus="0-1", mib=4096)
    (monitor,) = fleet.spawn("node01", "monitor")
    (hog,) = fleet.spawn("node01", "stubborn", gpu=3, mib=1000, name="gpuhog --gpu 3")
    status = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert status["status"] == "dirty"
    assert f"held by {worker0} sglang::scheduler_TP0 (root; GPU0)" in status["error"]
    assert f"{worker1} sglang::scheduler_TP1 (root; GPU1)" in status["error"]
    assert "persistenced" not in status["error"] and "monitor" not in status["error"]
    (proc,) = status["gpus"][0]["processes"]
    assert {k: proc[k] for k in ("pid", "user", "cmdline", "used_mib")} == {
        "pid": worker0, "user": "root", "cmdline": "sglang::scheduler_TP0", "used_mib": 4096}

    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "protect=gpuhog",
               "-e", "verify_timeout=1", "--json")
    host = done.host("node01")
    assert done.code == 1 and host["status"] == "dirty"
    assert host["error"] == f"GPU3 1000 MiB; held by {hog} gpuhog --gpu 3 (root; GPU3; protected)"
    assert [p["pid"] for p in host["gpus"][3]["processes"]] == [hog]
    assert all(g["processes"] == [] for g in host["gpus"] if g["index"] != 3)
    assert alive(fleet, "node01", [hog, daemon(fleet), monitor]) == [hog, daemon(fleet), monitor]
    assert not {s["pid"] for s in host["signalled"]} & {hog, daemon(fleet), monitor}


def test_a_leak_ends_the_verification_by_the_leak_rule_and_names_the_gpu(
    fleet: SimFleet, cli: Cli
) -> None:
    fleet.set_fault("node01", "leak", 5, 512)
    (monitor,) = fleet.spawn("node01", "monitor")
    fleet.spawn("node01", "sglang", gpus="0-7", mib=2048)
    done = cli("run", "post-extraction", "-i", fleet.inventory_path,
               "-e", "verify_timeout=120", "--json")
    host = done.host("node01")
    assert done.code == 1 and host["status"] == "dirty"
    assert host["verify"] == {"rule": "leak"}
    assert host["error"].startswith(
        "GPU5 512 MiB; GPU5: 512 MiB held by no process (driver-level leak): "
        "run nvidia-smi --gpu-reset -i 5 or reboot (only ")
    assert f"{daemon(fleet)} nvidia-persistenced (protected)" in host["error"]
    assert f"{monitor} python3 (no CUDA context)" in host["error"]
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0] * 5 + [512, 0, 0]
    assert alive(fleet, "node01", [daemon(fleet), monitor]) == [daemon(fleet), monitor]


def test_memory_still_falling_is_not_a_leak(fleet: SimFleet, cli: Cli, tmp_path: Path) -> None:
    fleet.set_fault("node01", "leak", 2, 4000)
    book = tmp_path / "verify-only.yaml"
    book.write_text("name: verify-only\nstages: []\n"
                    "verify:\n  max_used_mib: 0\n  timeout: 60\n  interval: 0.05\n"
                    "  leak_quiet: 3\n")
    stop = threading.Event()

    def release() -> None:  # memory freed in steps, as a dying process's is
        for mib in (3000, 2000, 1000, 0):
            if stop.wait(0.4):
                return
            fleet.set_fault("node01", "leak", 2, mib)

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        done = cli("run", book, "-i", fleet.inventory_path, "--json")
    finally:
        stop.set()
        releaser.join()
    host = done.host("node01")
    assert host["verify"] == {"rule": "clean"} and host["status"] == "clean", host


FAULTS: list[tuple[tuple[str | int, ...], str]] = [
    (("driver",), "nvidia-smi exit 9 (NVIDIA driver not loaded)"),
    # A driver upgraded and not reloaded: no CUDA job can run there until a reboot.
    (("nvml",), "nvidia-smi exit 18 (the NVIDIA driver and its library differ"),
    (("nodevices",), "No devices were found"),
    (("inforom", 2), "nvidia-smi exit 14 (InfoROM corrupted)"),
    (("lost", 5), "nvidia-smi exit 15 (GPU fell off the bus or is lost)"),
    (("power", 2), "nvidia-smi exit 8 (external power cables not attached)"),
    (("irq", 7), "nvidia-smi exit 10 (kernel detected an interrupt issue with a GPU)"),
    # nvidia-smi's words, whatever its exit status.
    (("unknown", 3), "nvidia-smi exit 255 (a GPU does not answer: fallen off the bus or failed)"),
    (("nosupported",), "nvidia-smi exit 255 (no GPU bound to the NVIDIA driver)"),
    (("nodevices", 0), "nvidia-smi exit 0 (no GPU found): No devices were found"),
    (("badvalue", 2, "reset"), "GPU2: memory.used reads '[GPU requires reset]': reset the GPU"),
    (("badvalue", 4, "lost"), "GPU4: memory.used reads '[GPU is lost]': reboot the node"),
    (("retired-pending", 6), "GPU6: retired pages pending"),
    (("remapped-pending", 1), "GPU1: remapped rows pending"),
    (("xid", 79, 0), "Xid 79 on PCI 0000:18:00 (hardware/driver error in the kernel log)"),
    (("xid", 48, 3), "Xid 48 on PCI"),
]


@pytest.mark.parametrize(("fault", "reason"), FAULTS,
                         ids=["-".join(map(str, f[0])) for f in FAULTS])
def test_each_fault_makes_the_host_faulty_with_its_reason(
    fleet: SimFleet, cli: Cli, fault: tuple[str | int, ...], reason: str
) -> None:
    fleet.set_fault("node01", *fault)
    done = cli("status", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert (done.code, host["status"]) == (1, "faulty"), host
    assert reason in host["error"]
    assert done.json()["summary"]["faulty"] == 1 and done.json()["summary"]["failed"] == 0
    if fault[0] in ("lost", "unknown", "inforom"):  # the other GPUs' rows are kept
        assert len(host["gpus"]) == (8 if fault[0] == "inforom" else 7)
    if fault[0] == "lost":
        table = cli("status", "-i", fleet.inventory_path)
        assert f"node01: faulty: {reason}" in table.out and "1 faulty" in table.out


class Terminal(io.StringIO):
    """stderr as a person's terminal: the live view draws its frames into it."""

    def isatty(self) -> bool:
        return True


def test_the_live_view_counts_a_host_as_the_table_shows_it(
    fleet: SimFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The script reports the Xid; only the controller, which knows the host's last run,
    # makes it a fault: the live tally must not count the host clean meanwhile.
    fleet.set_fault("node01", "xid", 79, 0)
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path / "state"))
    # rich reads these from the process's environment: a terminal it draws on, wide.
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "200")
    for forced in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(forced, raising=False)
    out, err = io.StringIO(), Terminal()
    code = main(["status", "-i", str(fleet.inventory_path)],
                Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"}))
    frames = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue()).splitlines()
    tallies = [line.strip() for line in frames if line.strip().startswith("done:")]
    assert code == 1 and "0 clean, 0 dirty, 1 faulty" in out.getvalue()
    assert tallies and tallies[-1] == "done: faulty 1", frames


# The status script as sshd runs it (bash -s), with nvidia-smi logging its arguments: an
# exported function reaches the script's first line, which runs before its definitions.
LOGGED_STATUS = r"""nvidia-smi() { echo "$*" >>/tmp/smi.args; command nvidia-smi "$@"; }
export -f nvidia-smi
: >/tmp/smi.args
bash -s </tmp/status.sh | grep -c '^@@fleetclean.pages'
cat /tmp/smi.args"""


def test_the_row_remapper_is_read_only_where_the_kernel_log_cannot_rule_a_remap_out(
    fleet: SimFleet, cli: Cli
) -> None:
    script = cli("show", "status", "-i", fleet.inventory_path, "--host", "node01")
    fleet.node_path("node01", "/tmp/status.sh").write_text(script.out)

    def status() -> tuple[int, list[str]]:
        # As where CUDA processes run: the node's count makes the read -q (the query's
        # pending fields: test_e2e_last_clean.py).
        with uvm_counted(fleet, "node01", 1):
            out = fleet.run_in("node01", ["bash", "-c", LOGGED_STATUS]).stdout
        pages, *calls = out.split("\n")
        return int(pages), [c for c in calls if c]

    # A whole boot log with no ECC Xid: no remap can be pending, so no remapper section
    # (5 ms a GPU on an H200); an application's Xid 13 changes nothing.
    assert status() == (0, ["-q -d MEMORY,PIDS"])
    fleet.set_fault("node01", "xid", 13, 2)
    assert status() == (0, ["-q -d MEMORY,PIDS"])
    # The ECC error that marks a row (Xid 63): the remapper is read beside, and says Yes.
    fleet.set_fault("node01", "remapped-pending", 1)
    assert status() == (1, ["-q -d MEMORY,PIDS", "-q -d ROW_REMAPPER"])
    with uvm_counted(fleet, "node01", 1):
        host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert host["status"] == "faulty" and "GPU1: remapped rows pending" in host["error"]
    # The log cleared, its Xid 63 gone with it: no longer whole since boot, so the
    # remapper is still read and the pending remap still found.
    fleet.run_in("node01", ["dmesg", "-C"])
    assert status() == (1, ["-q -d MEMORY,PIDS", "-q -d ROW_REMAPPER"])
    with uvm_counted(fleet, "node01", 1):
        host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert host["status"] == "faulty" and "GPU1: remapped rows pending" in host["error"]
    fleet.set_fault("node01", "none")  # the simulator's reset: a whole boot log again
    assert status() == (0, ["-q -d MEMORY,PIDS"])


def test_fewer_gpus_than_expected_or_than_last_seen_is_faulty(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    inventory = edit_inventory(fleet, tmp_path / "inv.yaml", node01={"expected_gpus": 8})
    fleet.set_fault("node01", "fewer")
    by_var = cli("status", "-i", inventory, "--json").host("node01")
    never_seen = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    fleet.set_fault("node01", "none")
    cli("run", "pre-restart", "-i", fleet.inventory_path, "--json")  # seen with 8 GPUs
    fleet.set_fault("node01", "fewer")
    by_record = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert by_var["status"] == "faulty" and "7 GPU(s) visible, 8 expected" in by_var["error"]
    assert never_seen["status"] == "clean"  # nothing known about the host: no check
    assert by_record["status"] == "faulty"


def test_application_xids_and_a_busy_node_are_never_faulty(fleet: SimFleet, cli: Cli) -> None:
    for code in (13, 31, 43, 45):
        fleet.set_fault("node01", "xid", code, 1)
    fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
    fleet.spawn("node01", "monitor")
    status = cli("status", "-i", fleet.inventory_path, "--json")
    assert status.host("node01")["status"] == "dirty"
    assert status.json()["summary"]["faulty"] == 0
    teardown = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    assert teardown.host("node01")["status"] == "clean"  # a killed CUDA job's Xids, no fault


def test_a_holder_of_another_user_is_named_with_its_user(fleet: SimFleet, cli: Cli) -> None:
    hold = ("import os, sys, time; os.open('/dev/nvidia6', os.O_RDWR); "
            f"os.open('/dev/nvidia-uvm', os.O_RDWR); {uvm_count.OPENED_PY}; "
            "print(os.getpid(), flush=True); "
            "time.sleep(600)")
    started = fleet.run_in("node01", [
        "sh", "-c", "FLEETCLEAN_SIM_GPU_MIB=2048 setsid -f setpriv --reuid=65534 "
        "--regid=65534 --clear-groups python3 -c \"$0\" </dev/null >/tmp/nobody.pid 2>&1",
        hold])
    assert started.returncode == 0, started.stderr
    pid_file = fleet.node_path("node01", "/tmp/nobody.pid")
    deadline = time.monotonic() + 30
    while not pid_file.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert f"held by {pid} python3 -c {hold[:20]}" in host["error"]
    assert "(nobody; GPU6)" in host["error"]
    (proc,) = host["gpus"][6]["processes"]
    assert (proc["pid"], proc["user"], proc["used_mib"]) == (pid, "nobody", 2048)
