"""--drain-dirty and --resume-clean against the simulated fleet's real Slurm, over SSH."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from simhelp import Cli, down_checked, module_subnet
from slurmhelp import needs_slurm, node_idle, slurm_cmd, submit_gpu_holder, wait_for

from fleetclean.results import records
from fleetclean.sim import SimFleet
from fleetclean.sim import slurm as sim_slurm

pytestmark = [pytest.mark.sim, pytest.mark.slurm, needs_slurm]
# A GPU holder the teardown must not kill: a protected name, as a monitoring agent's.
KEEPER = "gpu-keeper"


@pytest.fixture(scope="module")
def slurm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    fleet = SimFleet.up(3, tmp_path_factory.mktemp("slurmdrain"), subnet=module_subnet(),
                        slurm=True)
    try:
        yield fleet
    finally:
        down_checked(fleet)


@pytest.fixture
def slurm_env(slurm_fleet: SimFleet, monkeypatch: pytest.MonkeyPatch) -> SimFleet:
    monkeypatch.setenv("SLURM_CONF", str(slurm_fleet.slurm_conf_path))
    return slurm_fleet


def teardown(cli: Cli, fleet: SimFleet, *extra: str,
             verify: int = 1) -> dict[str, dict[str, object]]:
    """post-extraction on the Slurm partition's nodes; ``verify``: the verification's
    timeout, short where a node must end dirty (it is waited out), long where every node
    must end clean (the verification ends as soon as the GPUs are free)."""
    result = cli("run", "post-extraction", "-i", "slurm:", "-F", fleet.ssh_config_path,
                 "-e", f"verify_timeout={verify}", "--json", *extra)
    assert result.code in (0, 1), result.err
    return {h["host"]: h for h in result.json()["hosts"]}


def test_a_node_left_dirty_is_drained_and_resumed_once_clean(slurm_env: SimFleet,
                                                             cli: Cli) -> None:
    fleet = slurm_env
    fleet.spawn("node02", "stubborn", gpu=2, mib=8192, name=f"{KEEPER} --gpu 2")
    hosts = teardown(cli, fleet, "-e", f"protect={KEEPER}", "--drain-dirty")
    assert hosts["node02"]["status"] == "dirty"
    assert hosts["node02"]["slurm"]["action"] == "drain"
    assert hosts["node02"]["slurm"]["state_before"] == "idle"
    assert hosts["node02"]["slurm"]["state_after"].startswith("drain")
    assert hosts["node01"]["slurm"]["action"] == "none"
    reasons = slurm_cmd(fleet, "sinfo", "-R", "-h", "-o", "%n|%E").stdout.split("\n")
    (reason,) = [r for r in reasons if r.startswith("node02|")]
    run_id = records.load_record("-1")["id"]
    assert reason.startswith(f"node02|fleetclean {run_id}: dirty: GPU2 8192 MiB")
    assert sim_slurm.node_states(fleet.state_dir)["node02"].startswith("drain")
    # The record keeps what was done to the node.
    recorded = records.load_record("-1")["result"]["hosts"]
    assert next(h for h in recorded if h["host"] == "node02")["slurm"]["action"] == "drain"

    # Still dirty: --resume-clean leaves it drained.
    still = cli("status", "-i", "slurm:", "-F", fleet.ssh_config_path, "--resume-clean",
                "--json")
    assert still.host("node02")["slurm"]["action"] == "none"
    # Without the protection the teardown frees the GPU, and the node comes back.
    hosts = teardown(cli, fleet, "--resume-clean", verify=20)
    assert hosts["node02"]["status"] == "clean"
    assert hosts["node02"]["slurm"]["action"] == "resume"
    assert wait_for(lambda: node_idle(fleet, "node02"))


def test_a_node_whose_gpu_a_running_job_holds_is_not_drained(slurm_env: SimFleet,
                                                             cli: Cli) -> None:
    fleet = slurm_env
    job = submit_gpu_holder(fleet, "node03", gpu=4, mib=2048)
    try:
        result = cli("status", "-i", "slurm:", "-F", fleet.ssh_config_path, "-l", "node03",
                     "--drain-dirty", "--json")
        node03 = result.host("node03")
        assert node03["status"] == "dirty"
        assert node03["slurm"]["action"] == "none"
        assert node03["slurm"]["state_before"] in ("mixed", "allocated")
        assert "job" in node03["slurm"]["reason"]
        assert not sim_slurm.node_states(fleet.state_dir)["node03"].startswith("drain")
    finally:
        slurm_cmd(fleet, "scancel", str(job))


def test_a_node_that_cannot_be_reached_is_not_drained(slurm_env: SimFleet, cli: Cli) -> None:
    fleet = slurm_env
    fleet.stop_node("node01")
    try:
        result = cli("status", "-i", "slurm:", "-F", fleet.ssh_config_path, "-l", "node01",
                     "--drain-dirty", "--json")
        assert result.host("node01")["status"] == "unreachable"
        assert result.host("node01")["slurm"]["action"] == "none"
        assert node_idle(fleet, "node01")
    finally:
        fleet.start_node("node01")


def test_drain_dirty_with_check_is_refused_before_anything_is_sent(
    slurm_env: SimFleet, cli: Cli
) -> None:
    result = cli("run", "post-extraction", "-i", "slurm:", "-F", slurm_env.ssh_config_path,
                 "--check", "--drain-dirty")
    assert result.code == 4
    assert "--check" in result.err


def test_through_a_login_node_a_leaking_node_is_drained_and_resumed_there(
    slurm_fleet: SimFleet, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sinfo and scontrol run on the login node (node01): this process has no SLURM_CONF.
    monkeypatch.delenv("SLURM_CONF", raising=False)
    fleet = slurm_fleet
    login = ("-i", "slurm://node01", "-F", str(fleet.ssh_config_path))
    fleet.set_fault("node03", "leak", 6, 3000)
    try:
        drained = cli("status", *login, "-l", "node03", "--drain-dirty", "--json")
        assert drained.code == 1, drained.err
        node03 = drained.host("node03")
        assert node03["status"] == "dirty"
        assert node03["slurm"]["action"] == "drain"
        reasons = slurm_cmd(fleet, "sinfo", "-R", "-h", "-o", "%n|%E").stdout.split("\n")
        (reason,) = [r for r in reasons if r.startswith("node03|")]
        assert "dirty: GPU6 3000 MiB" in reason
    finally:
        fleet.set_fault("node03", "leak", 6, 0)
    resumed = cli("status", *login, "-l", "node03", "--resume-clean", "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.host("node03")["slurm"]["action"] == "resume"
    assert wait_for(lambda: node_idle(fleet, "node03"))
