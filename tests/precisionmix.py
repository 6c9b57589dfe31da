"""Randomized precision mixes, shared by ``tests/reliability/test_precision.py`` (a CI
sample) and ``benchmarks/precision.py`` (the large seeded run).

Seeded random mixes of targets, protected GPU holders and unrelated processes on every node
of a fleet, torn down round after round. After every host teardown: every target is gone,
every protected and unrelated process is alive and is not in the JSON ``signalled`` list,
and each GPU holds exactly what the protected holders on it hold (they are kept below
``max_used_mib``), so the host is clean.
"""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simhelp import Cli

from fleetclean.sim import SimFleet

PLAYBOOK = """\
name: precision
description: post-extraction's signal stages with a short grace
vars:
  server_pattern: sglang.launch_server
  worker_pattern: sglang
  grace: 0.3
  max_used_mib: 256
  verify_timeout: 5
stages:
  - {name: stop-server, type: signal, pattern: "{{ server_pattern }}", grace: "{{ grace }}"}
  - {name: kill-workers, type: signal, pattern: "{{ worker_pattern }}", grace: "{{ grace }}"}
  - {name: kill-gpu-holders, type: gpu-holders, grace: "{{ grace }}"}
verify: {max_used_mib: "{{ max_used_mib }}", timeout: "{{ verify_timeout }}", interval: 0.05,
         settle: 0.1}
"""
PROTECTED_MIB = 40  # at most 6 protected holders per GPU stay under max_used_mib 256
# Names given with -e protect: one of them matches worker_pattern (sglang) on purpose.
USER_PROTECT = ["jupyter-lab", "tensorboard", "sglang-router"]
DEFAULT_PROTECTED = ["nv-hostengine", "dcgm-exporter", "nvidia-persistenced"]
TARGET_NAMES = ["python3 train.py --rank 0", "python3 hs_extract.py", "torchrun", "vllm-serve"]
UNRELATED = ["python3 node_monitor.py", "node_exporter", "python3 -m http.server 8000"]


@dataclass
class Plan:
    targets: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    protected_gpu: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)


def _spawn(fleet: SimFleet, node: str, rng: random.Random) -> Plan:
    plan = Plan()
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["sglang", "orphan", "stubborn", "slow", "stubborn-named"])
        gpu = rng.randrange(8)
        if kind == "sglang":
            first = rng.randrange(8)
            pids = fleet.spawn(node, "sglang", gpus=f"{first}-{min(7, first + rng.randrange(3))}",
                               mib=1000)
        elif kind == "stubborn-named":
            pids = fleet.spawn(node, "stubborn", gpu=gpu, mib=1000, name=rng.choice(TARGET_NAMES))
        elif kind == "slow":
            pids = fleet.spawn(node, "slow", gpu=gpu, mib=1000, delay=0.1)
        else:
            pids = fleet.spawn(node, kind, gpu=gpu, mib=1000)
        plan.targets += pids
        plan.kinds[kind] += 1
    for _ in range(rng.randint(0, 2)):
        gpu = rng.randrange(8)
        name = rng.choice(USER_PROTECT + DEFAULT_PROTECTED)
        plan.keep += fleet.spawn(node, "stubborn", gpu=gpu, mib=PROTECTED_MIB, name=name)
        plan.protected_gpu[gpu] += PROTECTED_MIB
        plan.kinds["protected"] += 1
    for _ in range(rng.randint(0, 1)):
        plan.keep += fleet.spawn(node, "monitor", name=rng.choice(UNRELATED))
        plan.kinds["unrelated"] += 1
    return plan


def run_rounds(fleet: SimFleet, cli: Cli, tmp_path: Path, rounds: int, seed: int) -> Counter[str]:
    book = tmp_path / "precision.yml"
    book.write_text(PLAYBOOK)
    totals: Counter[str] = Counter()
    names = [n.name for n in fleet.nodes]
    with ThreadPoolExecutor(len(names)) as pool:
        for r in range(rounds):
            seeds = [random.Random(f"{seed}/{r}/{n}") for n in names]
            plans = dict(zip(names, pool.map(_spawn, [fleet] * len(names), names, seeds),
                             strict=True))
            res = cli("run", book, "-i", fleet.inventory_path, "--json",
                      "-e", f"protect={','.join(USER_PROTECT)}")
            assert res.code == 0, f"seed {seed} round {r}: {res.out}{res.err}"
            for host in res.json()["hosts"]:
                _check(fleet, host, plans[host["host"]], f"seed {seed} round {r}")
                totals["teardowns"] += 1
                totals["signals"] += len(host["signalled"])
            for node, plan in plans.items():
                totals.update(plan.kinds)
                totals["targets_gone"] += len(plan.targets)
                totals["kept_alive"] += len(plan.keep)
                if plan.keep:  # reset the node for the next round: our own test processes
                    fleet.run_in(node, ["kill", "-KILL", *map(str, plan.keep)])
    return totals


def _check(fleet: SimFleet, host: dict[str, Any], plan: Plan, where: str) -> None:
    node = host["host"]
    running = {p.pid for p in fleet.processes(node)}
    assert host["status"] == "clean", (where, node, host["error"])
    assert not set(plan.targets) & running, (where, node, "target survived")
    assert set(plan.keep) <= running, (where, node, "protected/unrelated process died")
    signalled = {s["pid"] for s in host["signalled"]}
    assert not signalled & set(plan.keep), (where, node, "protected/unrelated signalled")
    expected = [plan.protected_gpu[i] for i in range(8)]
    assert fleet.gpu_used_mib(node) == expected, (where, node)
    assert [g["memory_used_mib"] for g in host["gpus"]] == expected, (where, node)
