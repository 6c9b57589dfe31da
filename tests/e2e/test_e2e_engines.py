"""free-gpus (issue #12 item 7) over SSH: one node running SGLang, vLLM, TensorRT-LLM,
Triton, TGI and Ray at once, each on its own GPUs, beside an NVML monitoring agent that
holds every GPU's device file. Every engine is stopped by its own stage, with its workers;
the agent and nvidia-persistenced are never touched."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from simhelp import Cli, alive

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
ENGINES = {  # kind: (GPUs, the stage that must stop it)
    "sglang": ("0", "stop-sglang"),
    "vllm": ("1,2", "stop-vllm"),
    "trtllm": ("3", "stop-trtllm"),
    "triton": ("4", "stop-triton"),
    "tgi": ("5", "stop-tgi"),
    "ray": ("6,7", "stop-ray"),
}


def test_free_gpus_stops_every_engine_and_never_the_monitoring_agent(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    trees = {kind: fleet.spawn("node01", kind, gpus=gpus) for kind, (gpus, _) in
             ENGINES.items()}
    (monitor,) = fleet.spawn("node01", "monitor")
    daemon = fleet.persistenced_pid("node01")
    assert daemon is not None and all(mib > 0 for mib in fleet.gpu_used_mib("node01"))
    done = cli("run", "free-gpus", "-i", fleet.inventory_path, "--json")
    host = done.host("node01")
    assert (done.code, host["status"], host["error"]) == (0, "clean", None)
    assert fleet.gpu_used_mib("node01") == [0] * 8
    stages = {s["name"]: s for s in host["stages"]}
    for kind, (_, name) in ENGINES.items():
        assert alive(fleet, "node01", trees[kind]) == [], kind
        assert stages[name]["status"] == "ok" and stages[name]["matched"] >= 1, (kind, stages)
    # Each server went with its own stage: nothing was left for the catch-alls.
    assert stages["kill-workers"]["matched"] == stages["kill-gpu-holders"]["matched"] == 0
    assert alive(fleet, "node01", [monitor, daemon]) == [monitor, daemon]
    assert not {s["pid"] for s in host["signalled"]} & {monitor, daemon}
    assert host["left_running"] == []
