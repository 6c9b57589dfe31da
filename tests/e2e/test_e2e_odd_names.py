"""A GPU process whose name breaks nvidia-smi's CSV: argv[0] with a comma and a newline,
which nvidia-smi prints as it is, so that its compute-apps line ends in a comma and the
rest of it starts the next line. Any user can name a process so; a status and a teardown
on that node must still say what holds the GPU, and the teardown still free it."""

from __future__ import annotations

import json

import pytest
from simhelp import Cli, alive, uvm_counted

from fleetclean.sim import SimFleet, uvm_count

pytestmark = pytest.mark.sim
ODD = "trainer,\nx"


def spawn_odd(fleet: SimFleet, node: str, *, gpu: int, mib: int, name: str = ODD,
              comm: str = "") -> int:
    gpus = json.loads((fleet.node(node).dir / "gpus.json").read_text())["gpus"]
    # A CUDA process's files: its GPU's and /dev/nvidia-uvm; its comm, where given, set
    # with prctl(PR_SET_NAME).
    rename = f"import ctypes; ctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0); " if comm else ""
    code = (f"{rename}import time; f = open('/dev/nvidia{gpus[gpu]['minor']}');"
            f" u = open('/dev/nvidia-uvm'); {uvm_count.OPENED_PY}; time.sleep(3600)")
    start = ('FLEETCLEAN_SIM_GPU_MIB="$2" setsid -f bash -c \'exec -a "$0" python3 -c "$1"\''
             ' "$1" "$3" </dev/null >/dev/null 2>&1')
    done = fleet.run_in(node, ["sh", "-c", start, "sh", name, str(mib), code])
    assert done.returncode == 0, done.stderr
    for _ in range(300):
        found = [p.pid for p in fleet.processes(node) if p.cmdline.startswith(name + " -c")]
        if found and fleet.gpu_used_mib(node)[gpu] >= mib:
            return found[0]
        fleet.run_in(node, ["sleep", "0.05"])
    raise AssertionError("the oddly named process did not start")


def forge_and_tear_down(fleet: SimFleet, cli: Cli, victim: int, gpu: int) -> tuple[dict, int]:
    """Start a process on GPU ``gpu`` named "run", a newline and "VICTIM,v1,9,GPU-<that
    GPU's UUID>" (no space in it: nvidia-smi names a process by its command line's first
    word), check that nvidia-smi prints the forged line, then tear the node down as one
    whose nvidia-smi gives [N/A] for memory: its -q read cannot be parsed, and the teardown
    takes the compute apps' CSV, where the forged line is (the simulator's names hold no
    space, so a whole block of -q's text cannot be forged here). The host's report, and
    the forger's PID."""
    uuid = fleet.run_in("node01", ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader",
                                   "-i", str(gpu)]).stdout.strip()
    forger = spawn_odd(fleet, "node01", gpu=gpu, mib=1024, name=f"run\n{victim},v1,9,{uuid}")
    smi = fleet.run_in("node01", ["nvidia-smi", "--query-compute-apps=pid,process_name",
                                  "--format=csv,noheader"]).stdout
    assert f"\n{victim},v1,9,{uuid}" in smi  # the forged line, as nvidia-smi prints it
    fleet.set_fault("node01", "na")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json",
              "-e", "grace=1", "-e", "verify_timeout=2")
    host: dict = res.host("node01")
    assert victim not in {s["pid"] for s in host["signalled"]}, host
    return host, forger


def test_a_process_whose_name_breaks_the_csv_is_still_named_and_stopped(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    # Read with --query-gpu, then the compute apps' CSV: as where the process started just
    # after the node's count of CUDA processes was read (uvm_counted; the count read 1, the
    # GPUs and processes are read with -q, whose listing a newline does not cut).
    assert cli("status", "-i", fleet.inventory_path, "--json").code == 0
    pid = spawn_odd(fleet, "node01", gpu=2, mib=3072)
    smi = fleet.run_in("node01", ["nvidia-smi", "--query-compute-apps=pid,process_name",
                                  "--format=csv,noheader"]).stdout
    assert f"{pid}, trainer,\n" in smi  # as nvidia-smi prints it: the line cut in two
    with uvm_counted(fleet, "node01", 0):
        status = cli("status", "-i", fleet.inventory_path, "--json")
    assert status.code == 1, status.out  # dirty, not an error
    host = status.host("node01")
    assert host["status"] == "dirty", host
    assert pid in {p["pid"] for g in host["gpus"] for p in g["processes"]}, host
    # The table names it on one line, its newline written out, not obeyed.
    table = cli("status", "-i", fleet.inventory_path)
    assert f"{pid} trainer,\\nx -c import" in table.out, table.out
    assert not any(line.startswith("x -c import") for line in table.out.splitlines())
    # A teardown, on the host seen in use, then again on one seen clean (whose GPU read,
    # then the gpu-holders stage, read the apps' CSV).
    for gpu in (2, 5):
        if gpu == 5:
            pid = spawn_odd(fleet, "node01", gpu=gpu, mib=2048)
        res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json",
                  "-e", "grace=1", "-e", "verify_timeout=5")
        assert res.host("node01")["status"] == "clean", res.out
        assert alive(fleet, "node01", [pid]) == []
        assert fleet.gpu_used_mib("node01")[gpu] == 0


def test_a_forged_line_of_nvidia_smis_list_gets_no_process_killed(
    sim_fleet_factory, cli: Cli
) -> None:
    """A process named "run", a newline and "PID,v1,MiB,GPU-<its GPU's UUID>" lists PID as
    holding that GPU: a teardown as root took it for a holder and killed it."""
    fleet = sim_fleet_factory(1)
    assert cli("status", "-i", fleet.inventory_path, "--json").code == 0  # seen clean
    # Anyone's process, on no GPU (one with a GPU's device file open is a holder of it,
    # and a teardown of that GPU stops it whatever nvidia-smi's list says).
    tag = "fcvictim-not-on-any-gpu"
    fleet.run_in("node01", ["sh", "-c", f"setsid -f bash -c 'exec -a {tag} sleep 3600' "
                            "</dev/null >/dev/null 2>&1"])
    for _ in range(100):
        victims = [p.pid for p in fleet.processes("node01") if p.cmdline.startswith(tag)]
        if victims:
            break
        fleet.run_in("node01", ["sleep", "0.05"])
    [victim] = victims
    _, forger = forge_and_tear_down(fleet, cli, victim, 3)
    # The forger, who does use GPU3, is stopped: the list read again without the names
    # (a process's name holds a newline) names it.
    assert alive(fleet, "node01", [victim, forger]) == [victim]


def test_a_forged_line_naming_a_monitoring_agent_gets_it_no_signal(
    sim_fleet_factory, cli: Cli
) -> None:
    """The same forgery naming a process that does have the GPU's device file open: an
    NVML user (a monitoring agent) holds every GPU's file, and no CUDA context
    (/dev/nvidia-uvm), so it never uses GPU memory and no stage signals it."""
    fleet = sim_fleet_factory(1)
    assert cli("status", "-i", fleet.inventory_path, "--json").code == 0  # seen clean
    [agent] = fleet.spawn("node01", "monitor")
    forge_and_tear_down(fleet, cli, agent, 4)
    assert agent in alive(fleet, "node01", [agent])


def test_a_forged_line_naming_a_cuda_process_with_that_gpus_file_gets_it_no_signal(
    sim_fleet_factory, cli: Cli
) -> None:
    """A CUDA process opens every GPU's device file it may see (no device cgroup, no
    CUDA_VISIBLE_DEVICES), with a context, and memory, on its own GPU only: here, one with
    GPU 4's file and /dev/nvidia-uvm open and no memory there. A forged line listing it on
    GPU 4 passed every check of its files, and a teardown killed it; the list is now read
    again without the names, and only the forger, who does use GPU 4, is stopped."""
    fleet = sim_fleet_factory(1)
    bystander = spawn_odd(fleet, "node01", gpu=4, mib=0, name="fcbystander-own-gpu-elsewhere")
    _, forger = forge_and_tear_down(fleet, cli, bystander, 4)
    assert alive(fleet, "node01", [bystander, forger]) == [bystander]
    fleet.set_fault("node01", "none")
    assert fleet.gpu_used_mib("node01")[4] == 0


def test_a_gpu_holder_whose_name_holds_a_newline_is_stopped(sim_fleet_factory, cli: Cli) -> None:
    """/proc/PID/stat prints a process's name (comm, which prctl(PR_SET_NAME) sets to any
    bytes) as it is: a newline in it cut the stat read at its first line, and the process,
    with no fields and no start time, was passed over by every stage."""
    fleet = sim_fleet_factory(1)
    gpus = json.loads((fleet.node("node01").dir / "gpus.json").read_text())["gpus"]
    code = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'sglang\\nx', 0, 0, 0);"
            f" f = open('/dev/nvidia{gpus[6]['minor']}'); u = open('/dev/nvidia-uvm');"
            f" {uvm_count.OPENED_PY}; time.sleep(3600)")
    start = ('FLEETCLEAN_SIM_GPU_MIB=2048 setsid -f python3 -c "$1" fcnewline-comm'
             ' </dev/null >/dev/null 2>&1')
    assert fleet.run_in("node01", ["sh", "-c", start, "sh", code]).returncode == 0
    for _ in range(300):
        found = [p.pid for p in fleet.processes("node01") if "fcnewline-comm" in p.cmdline]
        if found and fleet.gpu_used_mib("node01")[6] >= 2048:
            break
        fleet.run_in("node01", ["sleep", "0.05"])
    [pid] = found
    assert "\n" in fleet.run_in("node01", ["cat", f"/proc/{pid}/comm"]).stdout.rstrip("\n")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json",
              "-e", "grace=1", "-e", "verify_timeout=5")
    assert pid in {s["pid"] for s in res.host("node01")["signalled"]}, res.host("node01")
    assert alive(fleet, "node01", [pid]) == []
    assert res.host("node01")["status"] == "clean", res.host("node01")


def test_the_verification_names_the_forger_not_the_pid_its_forged_line_lists(
    sim_fleet_factory, cli: Cli
) -> None:
    """A protected process (no stage stops it) named "run", a newline and "VICTIM,v1,9,
    GPU-<GPU3's UUID>", on GPU3, on a node whose GPUs read as CSV (a retirement pending on
    GPU6): the verification read the forged line, named the victim as GPU3's holder and
    hid the forger, whose own line the newline cut short."""
    fleet = sim_fleet_factory(1)
    fleet.set_fault("node01", "retired-pending", 6)
    victim = fleet.spawn("node01", "stubborn", gpu=1, mib=2048)[0]
    uuid = fleet.run_in("node01", ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader",
                                   "-i", "3"]).stdout.strip()
    forger = spawn_odd(fleet, "node01", gpu=3, mib=1024, name=f"run\n{victim},v1,9,{uuid}",
                       comm="fcforger")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json",
              "-e", "grace=1", "-e", "verify_timeout=2", "-e", '{"protect": ["fcforger"]}')
    host = res.host("node01")
    named = {g["index"]: {p["pid"] for p in g["processes"]} for g in host["gpus"]}
    assert forger in named[3] and victim not in named[3], host
    assert alive(fleet, "node01", [forger]) == [forger]
