"""Owned processes for the randomized precision suite (issue 14): workloads a supervisor
runs, each with what a teardown must do to it, and the check that it did exactly that.

- ``service``: a ``Restart=always`` unit whose MainPID holds a GPU: stopped through
  systemd, so gone and not restarted (the unit inactive);
- ``container``: a container with ``--restart always``: stopped through docker;
- ``tmux``, ``screen``: signalled as plain processes: gone;
- ``pod``: a Kubernetes pod (``restartPolicy: Never``, so that the test can end it by PID):
  refused, left running, never in ``signalled``, the host dirty and the pod named;
- ``protected-unit``: a unit whose main process has a protected name: neither stopped nor
  signalled, left running.

A wrong kill is a kept process (pod, protected unit) that died or was signalled, or a
unit or container that was stopped while it runs a protected process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from fleetclean.sim import SimFleet

KINDS = ("service", "container", "tmux", "screen", "pod", "protected-unit")
PROTECTED_MIB = 40


@dataclass
class Owned:
    """What one node runs under supervisors this round, and what must happen to it."""

    gone: list[int] = field(default_factory=list)  # targets that must not survive
    kept: list[int] = field(default_factory=list)  # never signalled, alive at the end
    units_stopped: list[str] = field(default_factory=list)
    containers_stopped: list[str] = field(default_factory=list)
    kept_units: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    protected_gpu: dict[int, int] = field(default_factory=dict)
    kinds: list[str] = field(default_factory=list)


def spawn_owned(fleet: SimFleet, node: str, rng: random.Random, tag: str) -> Owned:
    """One to three owned workloads on ``node``, on GPUs of their own choosing."""
    plan = Owned()
    for i in range(rng.randint(1, 3)):
        kind = rng.choice(KINDS)
        gpu = rng.randrange(8)
        name = f"o{tag}x{i}"
        plan.kinds.append(kind)
        if kind == "service":
            plan.gone += fleet.spawn(node, "service", unit=name, gpus=str(gpu), mib=1000)
            plan.units_stopped.append(f"{name}.service")
        elif kind == "container":
            plan.gone += fleet.spawn(node, "container", container=name, restart="always",
                                     gpus=str(gpu), mib=1000)
            plan.containers_stopped.append(name)
        elif kind in ("tmux", "screen"):
            plan.gone += fleet.spawn(node, kind, session=name, gpus=str(gpu), mib=1000)
        elif kind == "pod":
            plan.kept += fleet.spawn(node, "pod", pod=name, namespace="ml", gpus=str(gpu),
                                     mib=1000, restart_policy="Never")
            plan.pods.append(f"ml/{name}")
        else:
            plan.kept += fleet.spawn(node, "service", unit=name, run="stubborn",
                                     name="nv-hostengine", gpu=gpu, mib=PROTECTED_MIB,
                                     timeout_stop=1)  # it ignores SIGTERM: end_owned
            plan.kept_units.append(f"{name}.service")
            plan.protected_gpu[gpu] = plan.protected_gpu.get(gpu, 0) + PROTECTED_MIB
    return plan


def sh(fleet: SimFleet, node: str, command: str) -> str:
    done = fleet.run_in(node, ["sh", "-c", command])
    assert done.returncode == 0, (node, command, done.stderr)
    return done.stdout.strip()


def check_owned(fleet: SimFleet, host: dict[str, Any], plan: Owned, where: str) -> None:
    """What the teardown did to the owned workloads of one host is what it must do."""
    node = host["host"]
    running = set(sh(fleet, node, "ps -eo pid=").split())
    signalled = {s["pid"] for s in host["signalled"]}
    assert not {str(p) for p in plan.gone} & running, (where, node, "owned target survived")
    assert {str(p) for p in plan.kept} <= running, (where, node, "kept process died")
    assert not signalled & set(plan.kept), (where, node, "kept process signalled")
    for unit in plan.units_stopped:
        state = sh(fleet, node, f"systemctl show -p ActiveState --value {unit}")
        assert state == "inactive", (where, node, unit, state)
    for unit in plan.kept_units:
        state = sh(fleet, node, f"systemctl show -p ActiveState --value {unit}")
        assert state == "active", (where, node, unit, "protected unit stopped")
    for name in plan.containers_stopped:
        state = sh(fleet, node, f"docker inspect -f '{{{{.State.Status}}}}' {name}")
        assert state == "exited", (where, node, name, state)
    if plan.pods:
        assert host["status"] == "dirty", (where, node, host["error"])
        for pod in plan.pods:
            assert f"pod {pod}" in host["error"], (where, node, host["error"])
        assert {r["pid"] for r in host["refused"]} == set(plan.kept) - _unit_pids(plan, host)


def _unit_pids(plan: Owned, host: dict[str, Any]) -> set[int]:
    # The protected units' processes are never targets, so never refused either.
    return {p["pid"] for g in host["gpus"] for p in g["processes"]
            if p["owner"] and p["owner"]["kind"] == "systemd"} & set(plan.kept)


def end_owned(fleet: SimFleet, node: str, plan: Owned) -> None:
    """Back to idle for the next round: the kept units through systemd, pods by PID."""
    for unit in plan.kept_units:
        sh(fleet, node, f"systemctl stop {unit}")
    if plan.kept:
        fleet.run_in(node, ["kill", "-KILL", *map(str, plan.kept)])
