"""``fleetclean demo``: the whole story on a local simulated fleet.

Brings up N simulated 8-GPU nodes (real sshd each), starts an SGLang-like server on every
node plus the things a teardown must *not* touch (a python3 monitoring agent and
nvidia-persistenced), shows the GPU table, runs ``post-extraction`` over SSH, shows the table
again, proves the protected processes survived, and stops the fleet by PID.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console

from fleetclean import fleet
from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import Renderer
from fleetclean.engine.variables import resolve
from fleetclean.errors import ExitStatus
from fleetclean.inventory import load_inventory
from fleetclean.models import RunResult
from fleetclean.results import table
from fleetclean.results.words import counted
from fleetclean.transport import Options


def _run(inventory: Path, playbook: str, extra: dict[str, object]) -> RunResult:
    hosts = load_inventory(inventory, ssh_config=None).select(None)
    book = load_playbook(playbook)
    renderer = Renderer()
    jobs = [fleet.Job(h, renderer.pieces(resolve(book, h.vars, extra), host_name=h.name))
            for h in hosts]
    return fleet.run_fleet(jobs, playbook=book.name, opts=Options(timeout=120), forks=64)


def run_demo(console: Console, *, nodes: int = 4, state_dir: str | None = None) -> int:
    from fleetclean.sim import SimFleet

    directory = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="fleetclean-demo-"))
    console.print(f"[bold]1.[/] Starting {nodes} simulated 8-GPU nodes (real sshd each) in "
                  f"{directory} ...")
    t0 = time.monotonic()
    sim = SimFleet.up(nodes=nodes, state_dir=directory)
    try:
        console.print(f"   up in {time.monotonic() - t0:.2f}s: "
                      + ", ".join(f"{n.name}={n.address}" for n in sim.nodes))
        console.print("[bold]2.[/] On every node: an SGLang server with 8 TP workers (one per "
                      "GPU), a python3 monitoring agent, nvidia-persistenced; on the first, "
                      "an orphaned worker and one that ignores SIGTERM.")
        keep: dict[str, list[int]] = {}
        for i, node in enumerate(sim.nodes):
            sim.spawn(node.name, "sglang")
            keep[node.name] = sim.spawn(node.name, "monitor") + sim.spawn(node.name, "persistenced")
            if i == 0 and nodes > 0:
                sim.spawn(node.name, "orphan", gpu=3)
                sim.spawn(node.name, "stubborn", gpu=5)
        inventory = sim.inventory_path
        before = _run(inventory, "status", {})
        table.print_result(console, before)
        console.print(f"[bold]3.[/] fleetclean run post-extraction -i {inventory}")
        after = _run(inventory, "post-extraction", {"grace": 2})
        table.print_result(console, after)
        alive = {
            name: [p.pid for p in sim.processes(name) if p.pid in pids]
            for name, pids in keep.items()
        }
        survived = all(len(alive[n]) == len(keep[n]) for n in keep)
        console.print(
            "[bold]4.[/] Protected processes (monitoring agent, nvidia-persistenced) still "
            f"running on every node: {'[green]yes[/]' if survived else '[red]NO[/]'}"
        )
        signals = sum(len(h.signalled) for h in after.hosts)
        console.print(f"   {counted(signals, 'process', 'processes')} signalled in "
                      f"{after.duration_s:.2f}s for {counted(nodes, 'node')}; the seed command "
                      "sleeps 14s per host.")
        ok = after.exit_status is ExitStatus.OK and survived
        return int(ExitStatus.OK if ok else after.exit_status or ExitStatus.DIRTY)
    finally:
        sim.down()
        console.print("[bold]5.[/] Simulated fleet stopped; every process it started is gone.")
