"""Randomized precision with owned processes (issue 14): seeded mixes of units, containers,
tmux and screen sessions, pods and protected units on two nodes, torn down round after
round with post-extraction's stages; 0 wrong kills (``owned.py`` says what each kind must
come to). The counts are printed (``-s``) and recorded in RELIABILITY.md.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from owned import check_owned, end_owned, spawn_owned
from simhelp import Cli

from fleetclean.sim import cgroups as sim_cgroups

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(sim_cgroups.plan("probe").mode == "none",
                       reason=f"no writable cgroup hierarchy: {sim_cgroups.plan('probe').why}"),
]

PLAYBOOK = """\
name: precision-owned
description: post-extraction's signal stages with a short grace
vars: {grace: 0.3, max_used_mib: 256, verify_timeout: 5}
stages:
  - {name: stop-server, type: signal, pattern: sglang.launch_server, grace: "{{ grace }}"}
  - {name: kill-workers, type: signal, pattern: sglang, grace: "{{ grace }}"}
  - {name: kill-gpu-holders, type: gpu-holders, grace: "{{ grace }}"}
verify: {max_used_mib: "{{ max_used_mib }}", timeout: "{{ verify_timeout }}", interval: 0.05}
"""


def test_precision_with_owned_processes(sim_fleet_factory: Any, cli: Cli,
                                        tmp_path: Path) -> None:
    fleet = sim_fleet_factory(2)
    book = tmp_path / "owned.yml"
    book.write_text(PLAYBOOK)
    totals: Counter[str] = Counter()
    for r in range(3):
        plans = {n.name: spawn_owned(fleet, n.name, random.Random(f"14/{r}/{n.name}"),
                                     f"{r}{n.name[-1]}") for n in fleet.nodes}
        res = cli("run", book, "-i", fleet.inventory_path, "--json")
        for host in res.json()["hosts"]:
            plan = plans[host["host"]]
            check_owned(fleet, host, plan, f"round {r}")
            totals.update(plan.kinds)
            totals["teardowns"] += 1
            totals["gone"] += len(plan.gone)
            totals["kept_alive"] += len(plan.kept)
        for name, plan in plans.items():
            end_owned(fleet, name, plan)
            deadline = time.monotonic() + 30
            while fleet.gpu_used_mib(name) != [0] * 8:
                assert time.monotonic() < deadline, f"{name} did not come back to idle"
                time.sleep(0.05)
    print(f"precision owned: {dict(totals)}")
    assert totals["teardowns"] == 6
