"""Bring your own fan-out: ``fleetclean export script`` run by the real clush (ClusterShell,
direct and through a gateway in tree mode), pdsh (its ssh module) and srun against the
simulated fleet, and ``fleetclean report`` on what they printed, compared with a direct
run of the same playbook on the same workloads: same hosts, statuses, GPU rows, stages and
signalled processes (PIDs aside: each run has its own processes)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simhelp import (
    HOSTILE_BASHRC,
    Cli,
    alive,
    down_checked,
    module_subnet,
    skip_unless_own_root,
)
from slurmhelp import needs_slurm

from fleetclean.sim import SimFleet
from fleetclean.sim import slurm as sim_slurm

pytestmark = [pytest.mark.sim, pytest.mark.slurm, needs_slurm]
# node03's leak ends its verification by the leak rule (1 s without a fall), well before
# the deadline: with verify_timeout=1 the two raced, and a loaded run could end by either.
VARS = ("-e", "grace=1", "-e", "verify_timeout=5")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    # Slurm for srun; its shared dir is seen by every node, where the gateway of clush's
    # tree mode finds its ssh settings and srun's tasks the bundle.
    if shutil.which("clush") is None or shutil.which("pdsh") is None:
        pytest.skip("clush and pdsh not installed: run scripts/dev setup")
    sim = SimFleet.up(3, tmp_path_factory.mktemp("fanout"), subnet=module_subnet(), slurm=True)
    try:
        # A leak no kill frees: node03 is dirty in every run, the same way.
        sim.set_fault("node03", "leak", 3, 1000)
        yield sim
    finally:
        down_checked(sim)


def workloads(fleet: SimFleet) -> list[int]:
    """The same mess before every run: an SGLang server on node01, an orphaned worker on
    node02, a monitoring agent (kept) on both."""
    kept = fleet.spawn("node01", "monitor") + fleet.spawn("node02", "monitor")
    fleet.spawn("node01", "sglang", gpus="0-3")
    fleet.spawn("node02", "orphan", gpu=5)
    return kept


def essentials(data: dict[str, Any]) -> dict[str, Any]:
    """What a user compares between two runs: everything but durations and PIDs."""
    hosts = {}
    for h in data["hosts"]:
        hosts[h["host"]] = {
            "status": h["status"],
            "error": h["error"],
            "stages": [(s["name"], s["type"], s["status"], s["matched"], s["signalled"],
                        s["remaining"]) for s in h["stages"]],
            "gpus": h["gpus"],
            "signalled": sorted((s["cmdline"], s["signal"]) for s in h["signalled"]),
        }
    return {"playbook": data["playbook"], "summary": data["summary"], "hosts": hosts}


def direct_run(fleet: SimFleet, cli: Cli) -> tuple[int, dict[str, Any]]:
    kept = workloads(fleet)
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, *VARS, "--json")
    assert alive(fleet, "node01", kept[:1]) == kept[:1]
    return res.code, essentials(res.json())


def bundle(fleet: SimFleet, cli: Cli, *extra: str) -> Path:
    path = fleet.state_dir / "shared" / ("fc.pdsh" if extra else "fc.sh")
    res = cli("export", "script", "post-extraction", "-i", fleet.inventory_path, *VARS, *extra)
    assert res.code == 0, res.err
    path.write_text(res.out)
    return path


def reported(cli: Cli, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = cli("report", *extra, "--json", out)
    return res.code, essentials(res.json())


def tool(argv: list[str], out: Path, *, stdin: Path | None = None,
         env: dict[str, str] | None = None) -> None:
    """Run a fan-out tool as people do, saving both of its streams to ``out``."""
    with out.open("w") as f, (stdin.open() if stdin else open(os.devnull)) as inp:
        subprocess.run(argv, stdin=inp, stdout=f, stderr=subprocess.STDOUT, timeout=120,
                       env={**os.environ, **(env or {})}, check=False)


def gateway_sessions(fleet: SimFleet) -> int:
    """Sessions node01's sshd started (VERBOSE logs one line for each)."""
    log = (fleet.node("node01").dir / "sshd.log").read_text(errors="replace")
    return log.count("Starting session: command")


def test_clush_and_pdsh_runs_of_the_bundle_report_as_a_direct_run(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    code, direct = direct_run(fleet, cli)
    assert code == 1, direct  # node03 leaks
    assert direct["hosts"]["node01"]["status"] == "clean"
    assert direct["hosts"]["node02"]["signalled"]
    script = bundle(fleet, cli)

    workloads(fleet)
    clush_out = tmp_path / "clush.txt"
    # As the README runs it: nothing of what the login's startup files export (-p).
    tool(["clush", "-b", "-w", "node[01-03]", "-o", f"-F {fleet.ssh_config_path}",
          "bash -p -s"], clush_out, stdin=script)
    assert reported(cli, clush_out) == (code, direct)
    assert reported(cli, clush_out, "--from", "clush") == (code, direct)

    workloads(fleet)
    pdsh_out = tmp_path / "pdsh.txt"
    tool(["pdsh", "-R", "ssh", "-w", "node[01-03]", bundle(fleet, cli, "--pdsh").read_text()],
         pdsh_out,
         env={"PDSH_SSH_ARGS_APPEND": f"-F {fleet.ssh_config_path}"})
    assert reported(cli, pdsh_out, "--from", "pdsh") == (code, direct)
    assert fleet.gpu_used_mib("node01") == [0] * 8


def test_pdsh_runs_the_bundle_clean_of_what_the_login_exports(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    skip_unless_own_root(fleet, "node02")
    bashrc = fleet.node_path("node02", "/root/.bashrc")
    assert not bashrc.exists()
    try:
        # pdsh hands the bundle to the login shell as its command, after its ~/.bashrc
        # ran in that very shell: errexit, nounset, POSIX mode, a `kill` function. The
        # bundle used to run there, and failed on node02 as a direct run never does.
        bashrc.write_text(HOSTILE_BASHRC)
        fleet.node_path("node02", "/root/bash_env.sh").write_text(
            "echo sourced >> /tmp/bash_env.log\n")
        code, direct = direct_run(fleet, cli)
        workloads(fleet)
        out = tmp_path / "pdsh.txt"
        tool(["pdsh", "-R", "ssh", "-w", "node[01-03]",
              bundle(fleet, cli, "--pdsh").read_text()], out,
             env={"PDSH_SSH_ARGS_APPEND": f"-F {fleet.ssh_config_path}"})
        assert reported(cli, out, "--from", "pdsh") == (code, direct)
        assert fleet.gpu_used_mib("node02") == [0] * 8
        assert not fleet.node_path("node02", "/tmp/bash_env.log").exists()
    finally:
        bashrc.unlink(missing_ok=True)


def test_a_startup_file_that_takes_the_bundles_start_stops_that_host_only(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    skip_unless_own_root(fleet, "node02")
    script = bundle(fleet, cli)
    bashrc = fleet.node_path("node02", "/root/.bashrc")
    assert not bashrc.exists()
    try:
        # node02's ~/.bashrc reads standard input (an ssh without -n, a read): under clush's
        # `bash -s` it takes the bundle's first bytes before bash sees any. 3,000 ends in
        # a line of the base64 (in the text, --plain, it ended in lib.sh's clock, and bash
        # ran the rest of that function's body); 25 in the line that says the start came;
        # 100 in the one that reads the rest (what is left of it does not parse).
        for taken in (3000, 25, 100):
            workloads(fleet)
            bashrc.write_text(f"head -c {taken} >/dev/null\n")
            out = tmp_path / f"clush-{taken}.txt"
            tool(["clush", "-b", "-w", "node[01-03]", "-o", f"-F {fleet.ssh_config_path}",
                  "bash -s"], out, stdin=script)
            hosts = {h["host"]: h for h in cli("report", "--json", out).json()["hosts"]}
            assert hosts["node02"]["status"] == "error"
            assert "nothing was run" in hosts["node02"]["error"], (taken, hosts["node02"])
            assert "~/.bashrc" in hosts["node02"]["error"]
            assert fleet.gpu_used_mib("node02")[5] > 0  # its orphan untouched
            assert hosts["node01"]["status"] == "clean"
            assert fleet.gpu_used_mib("node01")[:4] == [0] * 4
    finally:
        bashrc.unlink(missing_ok=True)
        # node02 as the tests after it expect (cleaned even where an assertion failed).
        cleaned = cli("run", "post-extraction", "-i", fleet.inventory_path, "-l", "node02",
                      *VARS)
    assert cleaned.code == 0, cleaned.err


def test_clush_tree_mode_through_a_gateway_reports_as_a_direct_run(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    code, direct = direct_run(fleet, cli)
    script = bundle(fleet, cli)
    # node01 is the gateway to node02 and node03: the root's clush reaches it alone, and
    # its own ClusterShell (python3 -m ClusterShell.Gateway) reaches the others.
    conf = fleet.state_dir / "shared" / "clustershell"
    conf.mkdir()
    for name in ("ssh_config", "id_ed25519", "known_hosts"):
        text = (fleet.state_dir / name).read_text()
        (conf / name).write_text(text.replace(str(fleet.state_dir / "id_ed25519"),
                                              str(conf / "id_ed25519"))
                                 .replace(str(fleet.state_dir / "known_hosts"),
                                          str(conf / "known_hosts")))
    (conf / "id_ed25519").chmod(0o600)
    root = socket.gethostname().split(".")[0]
    (conf / "topology.conf").write_text(f"[routes]\n{root}: node01\nnode01: node[02-03]\n")
    (conf / "clush.conf").write_text(f"[Main]\nssh_options: -F {conf / 'ssh_config'}\n"
                                     "color: never\n")

    workloads(fleet)
    out = tmp_path / "tree.txt"
    sessions = gateway_sessions(fleet)
    tool(["clush", "-b", "-w", "node[02-03]", "bash -s"], out, stdin=script,
         env={"CLUSTERSHELL_CFGDIR": str(conf)})
    assert gateway_sessions(fleet) == sessions + 1  # node01 relayed the script
    got_code, got = reported(cli, out)
    assert got["hosts"] == {h: direct["hosts"][h] for h in ("node02", "node03")}
    assert got_code == code
    # node01 was only the gateway: its server still runs; cleaned for the tests after.
    assert fleet.gpu_used_mib("node01")[0] > 0
    assert cli("run", "post-extraction", "-i", fleet.inventory_path, "-l", "node01",
               *VARS).code == 0


def test_srun_run_of_the_bundle_reports_as_a_direct_run(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    code, direct = direct_run(fleet, cli)
    script = bundle(fleet, cli)
    workloads(fleet)
    out = tmp_path / "srun.txt"
    tool(["srun", "-N3", "-w", "node[01-03]", "-l", "bash", str(script)], out,
         env=sim_slurm.slurm_env(fleet.state_dir, {}))
    assert reported(cli, out, "--from", "srun") == (code, direct)
    assert reported(cli, out) == (code, direct)


def test_a_host_the_tool_could_not_reach_is_reported_unreachable(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    script = bundle(fleet, cli, "--pdsh")
    fleet.stop_node("node02")
    try:
        out = tmp_path / "pdsh.txt"
        tool(["pdsh", "-R", "ssh", "-w", "node[01-02]", script.read_text()], out,
             env={"PDSH_SSH_ARGS_APPEND": f"-F {fleet.ssh_config_path}"})
        res = cli("report", "--json", out)
    finally:
        fleet.start_node("node02")
    assert res.code == 2
    node02 = res.host("node02")
    assert node02["status"] == "unreachable"
    assert "Connection refused" in node02["error"]
    assert res.host("node01")["status"] == "clean"
