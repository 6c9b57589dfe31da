"""Helpers for the tests that need the simulated fleet's real Slurm (``tests/slurm/``).

``SLURM_SKIP_REASON`` is set when this machine cannot run it (no simulated fleet, or
Slurm's Debian packages absent); the tests then skip with that reason.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.sim import SimFleet, uvm_count
from fleetclean.sim import slurm as sim_slurm

SLURM_SKIP_REASON: str | None = None
_lacking = sim_slurm.missing()
if _lacking:
    SLURM_SKIP_REASON = f"Slurm not installed ({', '.join(_lacking)}): run scripts/dev setup"

needs_slurm = pytest.mark.skipif(SLURM_SKIP_REASON is not None, reason=SLURM_SKIP_REASON or "")


def slurm_cmd(fleet: SimFleet, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A Slurm client command against ``fleet``'s controller, output captured."""
    return subprocess.run(
        list(argv),
        env=sim_slurm.slurm_env(fleet.state_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=Path("/"),
    )


def submit_gpu_holder(fleet: SimFleet, node: str, gpu: int, mib: int) -> int:
    """``sbatch`` a job on ``node`` whose process holds /dev/nvidiaGPU and /dev/nvidia-uvm,
    as a CUDA process does (``mib`` MiB as the fake nvidia-smi reports it), until
    cancelled; returns the job id once the node's nvidia-smi shows it."""
    script = (
        f"FLEETCLEAN_SIM_GPU_MIB={mib} exec python3 -c "
        f"'import time; f = open(\"/dev/nvidia{gpu}\"); u = open(\"/dev/nvidia-uvm\"); "
        f"{uvm_count.OPENED_PY}; time.sleep(3600)'"
    )
    done = slurm_cmd(
        fleet, "sbatch", "--parsable", "-w", node, "--gres=gpu:1", "-o", "/dev/null",
        "-J", "gpu-holder", "--wrap", script,
    )
    assert done.returncode == 0, done.stderr
    assert wait_for(lambda: fleet.gpu_used_mib(node)[gpu : gpu + 1] == [mib])
    return int(done.stdout.strip().split(";")[0])


def wait_for(check: Callable[[], bool], timeout: float = 30) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def node_idle(fleet: SimFleet, node: str) -> bool:
    """Idle in Slurm. A node just resumed reads ``idle*`` (not responding) until
    slurmctld's next contact with its slurmd, which callers wait out."""
    return sim_slurm.node_states(fleet.state_dir).get(node) == "idle"
