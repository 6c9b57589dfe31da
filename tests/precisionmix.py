"""Randomized precision mixes, shared by ``tests/reliability/test_precision.py`` (a CI
sample) and ``benchmarks/precision.py`` (the large seeded run).

Every round, every node gets a seeded random mix:

- 1-2 targets: an SGLang server (with its schedulers and detokenizer), a crashed SGLang
  server (the server killed alone: its workers are orphans of PID 1, the detokenizer
  holding no GPU), an orphaned scheduler, a stubborn or slow GPU holder, a custom GPU holder
  (a stubborn one named torchrun, vllm-serve, ...); in free-gpus rounds also vLLM,
  TensorRT-LLM, Triton, TGI and Ray trees;
- 0-2 protected GPU holders (40 MiB each, under ``max_used_mib``) and 0-1 unrelated process;
- 1-3 bystanders that only mention the servers: real ``tail -f`` of their logs, ``less``,
  ``vim`` (on ``.../sglang/launch_server.py``, which the old whole-command-line match took
  for the server), ``grep``, ``watch``, Python and shell scripts named after them, another
  user's processes, ``python3 -m http.server``, a tmux session named ``sglang``; each in a
  session of its own, as a person starts them (sim kind ``exec``).

Rounds alternate between post-extraction's and free-gpus' kill stages, read from the
built-in playbooks (their patterns and scopes exactly) with every grace cut to 0.3 s. After
every host teardown: every target is gone, every protected, unrelated and bystander process
is alive and none of them (nor a child of a bystander) is in the JSON ``signalled`` list,
and each GPU holds exactly what the protected holders on it hold, so the host is clean.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from simhelp import Cli

from fleetclean.sim import SimFleet

GRACE = 0.3
PROTECTED_MIB = 40  # at most 6 protected holders per GPU stay under max_used_mib 256
# Names given with -e protect: one of them matches worker_pattern (sglang) on purpose.
USER_PROTECT = ["jupyter-lab", "tensorboard", "sglang-router"]
DEFAULT_PROTECTED = ["nv-hostengine", "dcgm-exporter", "nvidia-persistenced"]
TARGET_NAMES = ["python3 train.py --rank 0", "python3 hs_extract.py", "torchrun", "vllm-serve"]
UNRELATED = ["python3 node_monitor.py", "node_exporter"]
ENGINES = ["vllm", "trtllm", "triton", "tgi", "ray"]
LOG = "/root/logs/sglang_server.log"
SLEEPER_PY = "import time\ntime.sleep(3600)\n"
SLEEPER_SH = "#!/bin/bash\nsleep 3600\n"
# name -> spawn options of sim kind "exec" (the node's address is filled in for http).
BYSTANDERS: dict[str, dict[str, Any]] = {
    "tail": {"argv": ["tail", "-f", LOG], "files": {LOG: "sglang ready\n"}},
    "tail-vllm": {"argv": ["tail", "-F", "/var/log/vllm/api_server.log"],
                  "files": {"/var/log/vllm/api_server.log": ""}},
    "less": {"argv": ["less", LOG], "files": {LOG: "sglang ready\n"}, "tty": True},
    "vim": {"argv": ["vim", "/opt/sglang/python/sglang/launch_server.py"], "tty": True,
            "files": {"/opt/sglang/python/sglang/launch_server.py": "# server\n"}},
    "grep": {"argv": ["grep", "--line-buffered", "vllm"], "tty": True},
    "watch": {"argv": ["watch", "-n", "1", f"grep -c sglang {LOG}"], "tty": True,
              "files": {LOG: "sglang ready\n"}},
    "analyze": {"argv": ["python3", "/root/analyze_sglang_results.py", "--log", LOG],
                "files": {"/root/analyze_sglang_results.py": SLEEPER_PY}},
    "bench": {"argv": ["bash", "/root/run_vllm_bench.sh", "--model", "/models/sglang-ref"],
              "files": {"/root/run_vllm_bench.sh": SLEEPER_SH}},
    "other-user-tail": {"argv": ["tail", "-f", "/tmp/sglang_bench.log"], "uid": 65534,
                        "files": {"/tmp/sglang_bench.log": ""}},
    "other-user-eval": {"argv": ["python3", "/tmp/vllm_eval.py", "sglang"], "uid": 65534,
                        "files": {"/tmp/vllm_eval.py": SLEEPER_PY}},
    "http": {"argv": ["python3", "-m", "http.server", "--bind", "ADDRESS", "0"]},
    "tmux": {},  # started by tmux itself (see _tmux)
}


def playbook(name: str, broad: bool = False) -> str:
    """The kill stages of built-in ``name`` with every grace cut to GRACE, and a verify
    that allows the protected holders' memory; ``broad``: whole command lines, scope all."""
    text = (resources.files("fleetclean.engine") / "playbooks" / f"{name}.yaml").read_text()
    book = yaml.safe_load(text)
    stages = [s for s in book["stages"] if s["type"] in ("signal", "gpu-holders")]
    for stage in stages:
        stage["grace"] = GRACE
        if broad and stage["type"] == "signal":
            stage.update(match="cmdline", scope="all")
    variables = {k: v for k, v in book["vars"].items() if "pattern" in k}
    return yaml.safe_dump({
        "name": f"precision-{name}", "description": f"{name}'s kill stages, grace {GRACE}",
        "vars": {**variables, "max_used_mib": 256},
        "stages": stages,
        "verify": {"max_used_mib": "{{ max_used_mib }}", "timeout": 5, "interval": 0.05,
                   "settle": 0.1},
    })


@dataclass
class Plan:
    targets: list[int] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)
    bystanders: list[int] = field(default_factory=list)
    protected_gpu: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)


def _target(fleet: SimFleet, node: str, rng: random.Random, engines: bool) -> tuple[str, list[int]]:
    kinds = ["sglang", "crashed-sglang", "orphan", "stubborn", "slow", "custom-holder"]
    kind = rng.choice(kinds + ENGINES if engines else kinds)
    gpu = rng.randrange(8)
    first = rng.randrange(7)
    gpus = f"{first}-{min(7, first + rng.randrange(3))}"
    if kind in ("sglang", "crashed-sglang", *ENGINES):
        pids = fleet.spawn(node, "sglang" if kind == "crashed-sglang" else kind, gpus=gpus,
                           mib=1000)
        if kind == "crashed-sglang":
            fleet.run_in(node, ["kill", "-KILL", str(pids[0])])
            pids = pids[1:]
    elif kind == "custom-holder":
        pids = fleet.spawn(node, "stubborn", gpu=gpu, mib=1000, name=rng.choice(TARGET_NAMES))
    elif kind == "slow":
        pids = fleet.spawn(node, "slow", gpu=gpu, mib=1000, delay=0.1)
    else:
        pids = fleet.spawn(node, kind, gpu=gpu, mib=1000)
    return kind, pids


def _tmux(fleet: SimFleet, node: str) -> list[int]:
    """A tmux session named sglang: the tmux server and the shell command in its pane."""
    sock = "/run/fleetclean-tmux-sglang"
    fleet.run_in(node, ["tmux", "-S", sock, "new-session", "-d", "-s", "sglang", "sleep 3600"])
    done = fleet.run_in(node, ["tmux", "-S", sock, "display-message", "-p", "-t", "sglang",
                               "#{pid} #{pane_pid}"])
    return [int(w) for w in done.stdout.split()]


def _bystander(fleet: SimFleet, node: str, name: str) -> list[int]:
    if name == "tmux":
        return _tmux(fleet, node)
    opts = dict(BYSTANDERS[name])
    opts["argv"] = [fleet.node(node).address if a == "ADDRESS" else a for a in opts["argv"]]
    return fleet.spawn(node, "exec", **opts)


def _spawn(fleet: SimFleet, node: str, rng: random.Random, engines: bool) -> Plan:
    plan = Plan()
    for _ in range(rng.randint(1, 2)):
        kind, pids = _target(fleet, node, rng, engines)
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
    for name in rng.sample(sorted(BYSTANDERS), rng.randint(1, 3)):
        plan.bystanders += _bystander(fleet, node, name)
        plan.kinds[f"bystander {name}"] += 1
    return plan


def _descendants(fleet: SimFleet, node: str, roots: list[int]) -> set[int]:
    """Children of the bystanders (a script's sleep, tmux's pane, watch's sh -c): none may be
    signalled either; watch's come and go, so they are not asked to be alive."""
    procs = fleet.processes(node)
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {p.pid for p in procs if p.ppid in frontier and p.pid not in found}
        found |= frontier
    return found


def run_rounds(fleet: SimFleet, cli: Cli, tmp_path: Path, rounds: int, seed: int, *,
               strict: bool = True, broad: bool = False,
               progress: Callable[[int, Counter[str]], None] | None = None) -> Counter[str]:
    """Tear down ``rounds`` mixes on every node; the totals, failures included (keys
    ``hosts_not_clean``, ``targets_left``, ``bystanders_signalled``, ...). ``strict``: the
    first failure is an AssertionError. ``broad``: the kill stages match whole command
    lines with scope: all, as before issue #13 (the baseline). ``progress(round, totals)``
    is called after every round."""
    books = {}
    for name in ("post-extraction", "free-gpus"):
        books[name] = tmp_path / f"precision-{name}.yml"
        books[name].write_text(playbook(name, broad))
    totals: Counter[str] = Counter()
    names = [n.name for n in fleet.nodes]
    with ThreadPoolExecutor(len(names)) as pool:
        for r in range(rounds):
            book = "free-gpus" if r % 2 else "post-extraction"
            seeds = [random.Random(f"{seed}/{r}/{n}") for n in names]
            plans = dict(zip(names, pool.map(_spawn, [fleet] * len(names), names, seeds,
                                             [book == "free-gpus"] * len(names)), strict=True))
            children = {n: _descendants(fleet, n, p.bystanders) for n, p in plans.items()}
            res = cli("run", books[book], "-i", fleet.inventory_path, "--json",
                      "-e", f"protect={','.join(USER_PROTECT)}")
            where = f"seed {seed} round {r} ({book})"
            assert res.code in (0, 1, 2), f"{where}: {res.out}{res.err}"
            for host in res.json()["hosts"]:
                if host["status"] not in ("clean", "dirty", "faulty") and not strict:
                    # The script never ran (the transport failed: a loaded machine's sshd
                    # late with its banner): nothing to judge, counted apart.
                    print(f"{where}: {host['host']}: {host['status']}: {host['error']}")
                    totals["hosts_not_run"] += 1
                    continue
                bad = _check(fleet, host, plans[host["host"]], children[host["host"]], where,
                             quiet=broad)
                assert not (strict and bad), (where, host["host"], dict(bad), host["error"])
                totals.update(bad)
                totals["teardowns"] += 1
                totals["signals"] += len(host["signalled"])
            for node, plan in plans.items():
                totals.update(plan.kinds)
                totals["target_pids"] += len(plan.targets)
                totals["protected_or_unrelated_pids"] += len(plan.keep)
                totals["bystander_pids"] += len(plan.bystanders)
                totals["bystander_children"] += len(children[node])
                leftover = [*plan.targets, *plan.keep, *plan.bystanders, *children[node]]
                if leftover:  # reset the node for the next round: our own test processes
                    fleet.run_in(node, ["kill", "-KILL", *map(str, leftover)])
            if progress is not None:
                progress(r, totals)
    return totals


FAILURES = ("hosts_not_clean", "targets_left", "protected_or_unrelated_signalled",
            "protected_or_unrelated_dead", "bystanders_signalled", "bystanders_dead",
            "gpus_not_as_expected", "gpus_reported_wrong")


def _check(fleet: SimFleet, host: dict[str, Any], plan: Plan, children: set[int],
           where: str, *, quiet: bool) -> Counter[str]:
    """What went wrong on one host, by kind (empty: nothing), each with an example."""
    node = host["host"]
    procs = fleet.processes(node)
    running = {p.pid for p in procs}
    # A target in its exit (command line already empty) is gone, as the teardown judges it.
    live = {p.pid for p in procs if p.cmdline}
    signalled = {s["pid"]: s for s in host["signalled"]}
    expected = [plan.protected_gpu[i] for i in range(8)]
    bad: Counter[str] = Counter()
    bad["hosts_not_clean"] += host["status"] != "clean"
    bad["targets_left"] += len(set(plan.targets) & live)
    bad["protected_or_unrelated_signalled"] += len(signalled.keys() & set(plan.keep))
    bad["protected_or_unrelated_dead"] += len(set(plan.keep) - running)
    bad["bystanders_signalled"] += len(signalled.keys() & (set(plan.bystanders) | children))
    bad["bystanders_dead"] += len(set(plan.bystanders) - running)
    bad["gpus_not_as_expected"] += sum(
        a != b for a, b in zip(fleet.gpu_used_mib(node), expected, strict=True))
    bad["gpus_reported_wrong"] += sum(
        g["memory_used_mib"] != b for g, b in zip(host["gpus"], expected, strict=True))
    bad = +bad
    if bad and not quiet:
        hit = [signalled[p]["cmdline"] for p in signalled.keys() & set(plan.bystanders)]
        print(f"{where}: {node}: {dict(bad)} {host['error'] or ''} {hit[:3]}")
    return bad
