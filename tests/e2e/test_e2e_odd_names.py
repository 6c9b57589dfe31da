"""A GPU process whose name breaks nvidia-smi's CSV: argv[0] with a comma and a newline,
which nvidia-smi prints as it is, so that its compute-apps line ends in a comma and the
rest of it starts the next line. Any user can name a process so; a status and a teardown
on that node must still say what holds the GPU, and the teardown still free it."""

from __future__ import annotations

import json

import pytest
from simhelp import Cli, alive

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
ODD = "trainer,\nx"


def spawn_odd(fleet: SimFleet, node: str, *, gpu: int, mib: int) -> int:
    gpus = json.loads((fleet.node(node).dir / "gpus.json").read_text())["gpus"]
    code = f"import time; f = open('/dev/nvidia{gpus[gpu]['minor']}'); time.sleep(3600)"
    start = ('FLEETCLEAN_SIM_GPU_MIB="$2" setsid -f bash -c \'exec -a "$0" python3 -c "$1"\''
             ' "$1" "$3" </dev/null >/dev/null 2>&1')
    done = fleet.run_in(node, ["sh", "-c", start, "sh", ODD, str(mib), code])
    assert done.returncode == 0, done.stderr
    for _ in range(300):
        found = [p.pid for p in fleet.processes(node) if p.cmdline.startswith("trainer,")]
        if found and fleet.gpu_used_mib(node)[gpu] >= mib:
            return found[0]
        fleet.run_in(node, ["sleep", "0.05"])
    raise AssertionError("the oddly named process did not start")


def test_a_process_whose_name_breaks_the_csv_is_still_named_and_stopped(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    # Seen clean first: its next status reads --query-gpu, then the compute apps' CSV.
    assert cli("status", "-i", fleet.inventory_path, "--json").code == 0
    pid = spawn_odd(fleet, "node01", gpu=2, mib=3072)
    smi = fleet.run_in("node01", ["nvidia-smi", "--query-compute-apps=pid,process_name",
                                  "--format=csv,noheader"]).stdout
    assert f"{pid}, trainer,\n" in smi  # as nvidia-smi prints it: the line cut in two
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
