"""The fake nvidia-smi against real H200 outputs: same lines, same spacing, same errors.

No fleet needed: the node facts come from a temporary gpus.json whose GPU 0 is the
fixture machine's GPU, and the holders are given, not scanned.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetclean.errors import SimError
from fleetclean.sim import faults, nvidia_smi, smi_state

UUID0 = "GPU-fa529bc3-df9c-8e3c-22fb-c95e99d1c9dc"
BUS0 = "00000000:00:06.0"
APPS = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id"
FULL = (
    "--query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total,memory.reserved,"
    "utilization.gpu,temperature.gpu,power.draw,mig.mode.current,persistence_mode,"
    "driver_version"
)
# The two-field query of the real captures (gpu_pending_held.txt, apps_two_held.txt).
PENDING = ("--query-gpu=index,uuid,name,memory.used,memory.total,retired_pages.pending,"
           "remapped_rows.pending")
REAL_PROCESS_NAME = smi_state.process_name  # before any test stubs it


def fixture(dir_: Path, name: str) -> tuple[str, int]:
    """(output, exit status) of a fixture file, its ``__rc=N`` line stripped."""
    text = (dir_ / name).read_text()
    body, _, rc = text.rpartition("__rc=")
    return body, int(rc)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    gpus = [{"index": 0, "uuid": UUID0, "bus_id": BUS0}]
    gpus += [{"index": i, "uuid": f"GPU-{i}", "bus_id": f"00000000:0{i}:00.0"} for i in range(1, 8)]
    (tmp_path / "gpus.json").write_text(json.dumps({"name": "node01", "gpus": gpus}))
    monkeypatch.setattr(smi_state, "NODE_DIR", str(tmp_path))
    monkeypatch.setattr(nvidia_smi, "holders", lambda: [])
    return tmp_path


def gpu0(argv: list[str]) -> tuple[str, int]:
    """Output for GPU 0 only, as the one-GPU fixture machine printed it."""
    return nvidia_smi.run([*argv, "-i", "0"])


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("q_seed.txt", ["--query-gpu=index,memory.used", "--format=csv,noheader"]),
        ("q_header.txt", ["--query-gpu=index,memory.used", "--format=csv"]),
        (
            "q_nounits.txt",
            ["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
        ),
        ("q_full.txt", [FULL, "--format=csv,noheader"]),
        ("apps_empty.txt", [APPS, "--format=csv,noheader"]),
        ("bad_field.txt", ["--query-gpu=index,bogus.field", "--format=csv,noheader"]),
    ],
)
def test_idle_gpu_queries_match_real_output_exactly(
    node: Path, nvidia_smi_fixtures: Path, name: str, argv: list[str]
) -> None:
    assert gpu0(argv) == fixture(nvidia_smi_fixtures, name)


def test_nounits_full_query_has_the_real_columns(node: Path, nvidia_smi_fixtures: Path) -> None:
    want, _ = fixture(nvidia_smi_fixtures, "q_full_nounits.txt")
    got, status = gpu0([FULL, "--format=csv,noheader,nounits"])
    assert status == 0
    # Power draw is the one live reading that differs between two real calls.
    assert got.split(", ")[:9] == want.split(", ")[:9]
    assert got.split(", ")[10:] == want.split(", ")[10:]


def test_held_gpu_is_listed_like_the_real_compute_app(
    node: Path, nvidia_smi_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvidia_smi, "holders", lambda: [(0, 6742, 41478)])
    monkeypatch.setattr(smi_state, "process_name", lambda pid: "python3")
    assert gpu0([APPS, "--format=csv,noheader"]) == fixture(
        nvidia_smi_fixtures, "apps_held_plain_TERM.txt"
    )
    used, _ = gpu0(["--query-gpu=index,memory.used", "--format=csv,noheader"])
    assert used == "0, 41478 MiB\n"


def test_plain_table_matches_the_real_screen_but_the_clock(
    node: Path, nvidia_smi_fixtures: Path
) -> None:
    want, rc = fixture(nvidia_smi_fixtures, "plain.txt")
    got, status = gpu0([])
    assert status == rc == 0
    assert got.splitlines()[1:] == want.splitlines()[1:]
    assert len(got.splitlines()[0]) == len(want.splitlines()[0])


def test_plain_table_of_eight_busy_gpus_keeps_every_column(
    node: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [(i, 100 + i, 62000) for i in range(8)]
    monkeypatch.setattr(nvidia_smi, "holders", lambda: held)
    monkeypatch.setattr(smi_state, "process_name", lambda pid: "sglang::scheduler_TP0")
    got, status = nvidia_smi.run([])
    lines = got.splitlines()[1:]
    assert status == 0
    assert {len(line) for line in lines if line} == {91}
    assert sum("62000MiB / 143771MiB" in line for line in lines) == 8
    assert sum("sglang::scheduler_TP0" in line for line in lines) == 8


def test_nvml_fault_exits_18_with_the_driver_message_and_the_librarys_version(
    node: Path,
) -> None:
    faults.apply(node, "nvml", [])
    # The second line as users report it ("NVML library version: 570.124"): major.minor of
    # the library, here the fake's own driver's.
    assert nvidia_smi.DRIVER == "580.159.04"
    assert nvidia_smi.run(["--query-gpu=index,memory.used", "--format=csv"]) == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n",
        18,
    )


def test_na_fault_prints_na_for_memory_only(node: Path) -> None:
    (node / "fault").write_text("na\n")
    got, status = gpu0(["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader"])
    assert (got, status) == ("0, [N/A], 143771 MiB\n", 0)


def test_unknown_compute_app_field_is_rejected(node: Path) -> None:
    got, status = nvidia_smi.run(["--query-compute-apps=pid,nonsense", "--format=csv"])
    assert (got, status) == ('Field "nonsense" is not a valid field to query.\n\n', 2)


def test_bad_gpu_id_finds_no_device(node: Path) -> None:
    assert nvidia_smi.run(["-i", "9", "--query-gpu=index", "--format=csv"])[1] == 6


@pytest.fixture
def held_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine of the -q fixtures: one GPU; held by two processes (40 and 8 GiB, 15 MiB
    of the GPU's used memory in neither) unless a test says otherwise."""
    gpus = [{"index": 0, "uuid": "GPU-34d59321-b75b-280a-17c6-3345f6ba227e", "bus_id": BUS0}]
    (tmp_path / "gpus.json").write_text(json.dumps({"name": "node01", "gpus": gpus}))
    monkeypatch.setattr(smi_state, "NODE_DIR", str(tmp_path))
    monkeypatch.setattr(nvidia_smi, "holders", lambda: [(0, 496, 41570), (0, 559, 8802)])
    monkeypatch.setattr(smi_state, "leaks", lambda: {0: 15})
    names = {"496": "python3", "559": "/opt/torch/.venv/bin/python3"}
    monkeypatch.setattr(smi_state, "process_name", lambda pid: names[pid])
    return tmp_path


def but_clock_and_free(text: str) -> list[str]:
    """-q lines without the clock, and without FB free memory, which the real tool rounds
    (used + free + reserved is the total or one MiB over)."""
    return [line for line in text.splitlines()
            if not line.startswith(("Timestamp ", "        Free   "))]


@pytest.mark.parametrize(("name", "groups"), [
    ("q_mem_pids_held.txt", "MEMORY,PIDS"),
    ("q_mem_pids_pr_rr_held.txt", "MEMORY,PIDS,PAGE_RETIREMENT,ROW_REMAPPER"),
])
def test_q_of_a_held_gpu_matches_the_real_layout(
    held_node: Path, nvidia_smi_fixtures: Path, name: str, groups: str
) -> None:
    want, rc = fixture(nvidia_smi_fixtures, name)
    got, status = nvidia_smi.run(["-q", "-d", groups])
    assert status == rc == 0
    assert but_clock_and_free(got) == but_clock_and_free(want)


def test_q_of_an_idle_gpu_matches_the_real_one_but_the_clock(
    held_node: Path, nvidia_smi_fixtures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvidia_smi, "holders", lambda: [])
    monkeypatch.setattr(smi_state, "leaks", lambda: {})
    want, _ = fixture(nvidia_smi_fixtures, "q_mem_pids_idle.txt")
    got, status = nvidia_smi.run(["--query", "--display=MEMORY,PIDS"])
    assert status == 0
    assert got.splitlines()[4:] == want.splitlines()[4:]
    assert len(got.splitlines()[3]) == len(want.splitlines()[3])  # the clock's line


def test_xml_with_display_groups_is_refused_as_by_the_real_tool(
    held_node: Path, nvidia_smi_fixtures: Path
) -> None:
    assert nvidia_smi.run(["-q", "-x", "-d", "MEMORY,PIDS"]) == fixture(
        nvidia_smi_fixtures, "q_x_with_d.txt")


def test_q_shows_each_fault_as_the_status_script_must_take_it(node: Path) -> None:
    (node / "pages.json").write_text(json.dumps({"remapped": [2], "retired": [3]}))
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS,ROW_REMAPPER"])
    blocks = text.split("\nGPU ")[1:]
    assert status == 0 and len(blocks) == 8
    assert "Pending                                        : Yes" in blocks[2]
    assert "Uncorrectable Error                            : 1" in blocks[2]
    # A GPU that retires pages has no row remapper: the script reads the CSV query then.
    assert "    Remapped Rows                                      : N/A" in blocks[3]
    assert sum("Pending                                        : No" in b for b in blocks) == 6
    (node / "lost").write_text("5\n")
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS,ROW_REMAPPER"])
    assert status == 15
    assert "Unable to determine the device handle for GPU0000:05:00.0: GPU is lost" in text
    (node / "lost").unlink()
    (node / "fault").write_text("na\n")
    text, _ = nvidia_smi.run(["-q", "-d", "MEMORY"])
    assert "        Used                                           : N/A" in text
    (node / "fault").write_text("inforom:0\n")
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS"])
    assert status == 14 and text.startswith("WARNING: infoROM is corrupted")


def test_q_without_groups_or_with_unknown_ones_is_not_simulated(node: Path) -> None:
    assert nvidia_smi.run(["-q"])[1] == 2
    assert nvidia_smi.run(["-q", "-d", "CLOCK"])[1] == 2
    assert nvidia_smi.run(["-d", "MEMORY"])[1] == 2


# The line as users report it from drivers 525 on (LLaVA#1466, nvidia-container-toolkit#69:
# "GPU0000:65:00.0", no space; older drivers, as in nvidia-docker#1553, printed
# "GPU 0000:09:00.0"): the bus id with four of its eight domain zeros.
UNKNOWN_REPORTED = "Unable to determine the device handle for GPU0000:65:00.0: Unknown Error"
ALL_QUERIES = [
    [],
    ["-L"],
    ["--query-gpu=index,memory.used", "--format=csv,noheader"],
    [APPS, "--format=csv"],
    ["-q", "-d", "MEMORY,PIDS"],
    ["-i", "3", "--query-gpu=index", "--format=csv"],
]


def test_unknown_error_gpu_is_its_error_line_the_others_kept_exit_255(node: Path) -> None:
    faults.apply(node, "unknown", ["5"])
    text, status = nvidia_smi.run(["--query-gpu=index,memory.used", "--format=csv,noheader"])
    lines = text.splitlines()
    assert status == 255 and len(lines) == 8
    assert lines[5] == UNKNOWN_REPORTED.replace("65:00.0", "05:00.0")
    assert lines[:5] + lines[6:] == [f"{i}, 0 MiB" for i in (0, 1, 2, 3, 4, 6, 7)]
    # The same line in place of that GPU's -q block, and as the compute apps' only line.
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS"])
    assert status == 255 and UNKNOWN_REPORTED.replace("65:00.0", "05:00.0") + "\n" in text
    assert text.count("\nGPU 00000000:") == 7
    text, status = nvidia_smi.run([APPS, "--format=csv,noheader"])
    assert (text, status) == (UNKNOWN_REPORTED.replace("65:00.0", "05:00.0") + "\n", 255)
    # Another GPU of it: one more line; a GPU not asked for (-i) is not opened.
    faults.apply(node, "unknown", ["2"])
    assert nvidia_smi.run(["--query-gpu=index", "--format=csv,noheader"])[0].count(
        ": Unknown Error\n") == 2
    assert nvidia_smi.run(["-i", "0", "--query-gpu=index", "--format=csv,noheader"]) == (
        "0\n", 0)
    faults.apply(node, "none", [])
    assert nvidia_smi.run(["--query-gpu=index", "--format=csv,noheader"])[1] == 0


def test_no_supported_gpus_ends_every_call_with_the_nvml_line_exit_255(node: Path) -> None:
    faults.apply(node, "nosupported", [])
    for argv in ALL_QUERIES:
        assert nvidia_smi.run(argv) == (
            "Failed to initialize NVML: No supported GPUs were found\n", 255), argv
    with pytest.raises(SimError):
        faults.apply(node, "nosupported", ["1"])
    faults.apply(node, "none", [])
    assert nvidia_smi.run([])[1] == 0


@pytest.mark.parametrize(("args", "status"), [([], 6), (["6"], 6), (["0"], 0)])
def test_no_devices_exits_with_the_status_of_the_version_modelled(
    node: Path, args: list[str], status: int
) -> None:
    faults.apply(node, "nodevices", args)
    for argv in ALL_QUERIES:
        assert nvidia_smi.run(argv) == ("No devices were found\n", status), argv


@pytest.mark.parametrize("args", [["x"], ["256"], ["0", "1"], ["-1"]])
def test_no_devices_refuses_a_status_no_process_can_exit_with(
    node: Path, args: list[str]
) -> None:
    with pytest.raises(SimError, match="bad fault arguments"):
        faults.apply(node, "nodevices", args)


@pytest.mark.parametrize(("words", "shown"), [
    ("reset", "[GPU requires reset]"), ("unknown", "[Unknown Error]"), ("lost", "[GPU is lost]"),
])
def test_bad_value_gpu_reads_its_error_word_for_memory_in_csv_and_q(
    node: Path, words: str, shown: str
) -> None:
    faults.apply(node, "badvalue", ["3", words])
    query = ["--query-gpu=index,memory.used,memory.total"]
    for fmt in ("csv,noheader", "csv,noheader,nounits"):
        text, status = nvidia_smi.run([*query, f"--format={fmt}"])
        unit = "" if "nounits" in fmt else " MiB"
        want = [f"{i}, 0{unit}, 143771{unit}" for i in range(8)]
        # As the real [N/A]: the bracketed word, no unit after it.
        want[3] = f"3, {shown}, {shown}"
        assert (text.splitlines(), status) == (want, 0)
    # With a header, the header is the usual one.
    text, _ = nvidia_smi.run([*query, "--format=csv", "-i", "3"])
    assert text == f"index, memory.used [MiB], memory.total [MiB]\n3, {shown}, {shown}\n"
    # -q: as -q prints N/A (no brackets), in that GPU's FB memory only.
    text, status = nvidia_smi.run(["-q", "-d", "MEMORY"])
    blocks = text.split("\nGPU ")[1:]
    assert status == 0 and len(blocks) == 8
    for key in ("Total", "Used"):
        assert nvidia_smi.line(key, shown[1:-1], 8) in blocks[3].splitlines()
        assert all(nvidia_smi.line(key, "0 MiB" if key == "Used" else "143771 MiB", 8)
                   in b.splitlines() for i, b in enumerate(blocks) if i != 3)
    assert nvidia_smi.line("Used", "0 MiB", 8) in blocks[3].splitlines()  # BAR1's Used
    faults.apply(node, "none", [])
    assert "[" not in nvidia_smi.run([*query, "--format=csv,noheader"])[0]


@pytest.mark.parametrize("args", [["3"], ["3", "busy"], ["x", "reset"], ["3", "reset", "1"]])
def test_bad_value_needs_a_gpu_and_one_of_its_words(node: Path, args: list[str]) -> None:
    with pytest.raises(SimError, match="bad fault arguments"):
        faults.apply(node, "badvalue", args)


def test_pending_fields_match_the_real_h200_retired_pages_na(
    held_node: Path, nvidia_smi_fixtures: Path
) -> None:
    # An H200 remaps rows and retires no pages: retired_pages.pending is [N/A] (no unit
    # with or without nounits), remapped_rows.pending No.
    assert nvidia_smi.run([PENDING, "--format=csv,noheader,nounits"]) == fixture(
        nvidia_smi_fixtures, "gpu_pending_held.txt")
    faults.apply(held_node, "retired-pending", ["0"])
    text, status = nvidia_smi.run([PENDING, "--format=csv,noheader,nounits"])
    assert status == 0 and text.endswith(", 143771, Yes, No\n")


@pytest.fixture
def real_holders(held_node: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """held_node's two processes as real ones of this machine, named as the captured ones
    were started: ``sleep`` run with argv[0] ``python3`` and ``/opt/torch/.venv/bin/python3``
    (an argument after it that nvidia-smi must leave out); the real process_name. Only
    these two PIDs are killed afterwards."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    procs = [subprocess.Popen([name, "600"], executable=sleep)
             for name in ("python3", "/opt/torch/.venv/bin/python3")]
    try:
        pids = [p.pid for p in procs]
        for pid in pids:  # Popen returns once exec has begun: its argv may be a moment late
            for _ in range(500):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read():
                        break
                time.sleep(0.01)
        monkeypatch.setattr(smi_state, "process_name", REAL_PROCESS_NAME)
        monkeypatch.setattr(nvidia_smi, "holders",
                            lambda: [(0, pids[0], 41570), (0, pids[1], 8802)])
        yield pids
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_process_names_are_argv0_as_given_like_the_real_capture(
    real_holders: list[int], nvidia_smi_fixtures: Path
) -> None:
    first, second = map(str, real_holders)
    want, rc = fixture(nvidia_smi_fixtures, "apps_two_held.txt")
    want = want.replace("496, ", f"{first}, ").replace("559, ", f"{second}, ")
    got = nvidia_smi.run(["--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                          "--format=csv,noheader,nounits"])
    assert got == (want, rc)
    # -q names them the same way.
    want, rc = fixture(nvidia_smi_fixtures, "q_mem_pids_held.txt")
    want = want.replace(": 496\n", f": {first}\n").replace(": 559\n", f": {second}\n")
    got_q, status = nvidia_smi.run(["-q", "-d", "MEMORY,PIDS"])
    assert status == rc == 0
    assert but_clock_and_free(got_q) == but_clock_and_free(want)


def test_a_process_with_no_command_line_is_not_found() -> None:
    """A zombie's /proc/PID/cmdline is empty: no argv[0] to print."""
    proc = subprocess.Popen(["true"])
    try:
        for _ in range(200):
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert REAL_PROCESS_NAME(str(proc.pid)) == "[Not Found]"
    finally:
        proc.wait()
    assert REAL_PROCESS_NAME(str(proc.pid)) == "[Not Found]"  # gone from /proc
