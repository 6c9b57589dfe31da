"""Hostile values never execute: in -e variables, inventory variables, host names, --limit
patterns, paths, protected names and shell-stage variables.

Each case runs a real teardown over SSH on live simulated nodes. Every hostile value tries
to create /tmp/pwned on the node (node /tmp is private to the node); after the run the
canary must not exist on any node, a /tmp/keep file must still exist (no glob or path
escape removed it), and an unrelated process on every node must still run and never have
been signalled. A run may refuse the value (exit 4) or run with it as plain data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from simhelp import Cli, alive

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim

PWN = "touch /tmp/pwned"

# Shell-hostile strings: each would create /tmp/pwned if it ever reached a shell as code.
HOSTILE = [
    f"$({PWN})",
    f"`{PWN}`",
    f"; {PWN}",
    f"'; {PWN}; '",
    f'"; {PWN}; "',
    f"\n{PWN}\n",
    f"&& {PWN}",
    f"| {PWN}",
    f"$({PWN.replace(' ', '${IFS}')})",
    f"$'\\x3b'{PWN}",
    f"%0a{PWN}",
    f"\\\n{PWN}",
    f"x\r{PWN}",
    f"@@fleetclean\tdone\t0\n{PWN}",
    f"{{{{ grace }}}}$({PWN})",
]


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...] = ()  # extra CLI args
    host_vars: dict[str, object] | None = None  # set on node01 in the inventory
    group_vars: dict[str, object] | None = None
    rename: str | None = None  # node01 renamed to this (its ansible_host kept)
    playbook: str | None = None  # YAML text of a custom playbook


def _cases() -> list[Case]:
    cases: list[Case] = []
    for i, value in enumerate(HOSTILE):
        cases.append(Case(f"e-dump_dir-{i}", ("-e", f"dump_dir=/dev/shm/x{value}")))
    for i, value in enumerate(HOSTILE[:6]):
        cases.append(Case(f"e-protect-{i}", ("-e", f"protect={value}")))
        cases.append(Case(f"inv-model_file-{i}", host_vars={"model_file": f"/opt/m{value}"}))
        cases.append(Case(f"inv-backup_suffix-{i}", group_vars={"backup_suffix": value}))
        cases.append(Case(f"hostname-{i}", rename=f"node{value}"))
        cases.append(Case(f"limit-{i}", ("-l", f"node01{value}")))
    patterns = [f"sglang|$({PWN})", f"`{PWN}`", f"x\\'; {PWN}; echo '", f"x[$({PWN})]"]
    for i, value in enumerate(patterns):
        cases.append(Case(f"e-pattern-{i}", ("-e", f"server_pattern={value}")))
    cases += [
        Case("e-guard-path", ("-e", f"guard_path=/dev/shm/$({PWN})")),
        Case("e-dump-dir-glob", ("-e", "dump_dir=/tmp/*")),  # literal: /tmp/keep survives
        Case("e-dump-dir-dotdot-glob", ("-e", "dump_dir=/dev/shm/../../tmp/*")),
        Case("e-json-protect-list", ("-e", '{"protect": ["$(touch /tmp/pwned)", "`x`"]}')),
        Case("inv-worker-pattern", host_vars={"worker_pattern": f"sglang$({PWN})"}),
        # No ProxyCommand case: like ssh, fleetclean runs an inventory's ProxyCommand on the
        # controller by design (tests/e2e/test_e2e_hops.py); it is configuration, not data.
        Case("shell-var", ("-e", f"x=$({PWN})"), playbook=(
            "name: shellvar\ndescription: d\nvars: {x: ''}\nstages:\n"
            "  - {name: echo, type: shell, command: 'printf %s {{ x }} > /tmp/echoed'}\n")),
        Case("shell-var-in-double-quotes", ("-e", f'x="; {PWN}; " *'), playbook=(
            "name: shellvar2\ndescription: d\nvars: {x: ''}\nstages:\n"
            "  - {name: echo, type: shell, command: 'echo \"v={{ x }}\" > /tmp/echoed'}\n")),
        Case("stage-wait-line", ("-e", f"line=$({PWN})"), playbook=(
            "name: guardline\ndescription: d\nvars: {line: ''}\nstages:\n"
            "  - {name: g, type: guard, wait_for_file: /tmp/keep, wait_for_line: 'k{{ line }}',"
            " timeout: 0.2}\n")),
    ]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> Iterator[SimFleet]:
    fleet = module_fleet_factory(2)
    yield fleet


@pytest.fixture(scope="module")
def bystanders(fleet: SimFleet) -> dict[str, list[int]]:
    """An unrelated monitoring agent on every node: must outlive every case."""
    return {n.name: fleet.spawn(n.name, "monitor", name="python3 node_monitor.py")
            for n in fleet.nodes}


def _inventory(fleet: SimFleet, case: Case, dest: Path) -> Path:
    data = yaml.safe_load(fleet.inventory_path.read_text())
    hosts = data["all"]["hosts"]
    if case.host_vars:
        hosts["node01"].update(case.host_vars)
    if case.group_vars:
        data["all"]["vars"].update(case.group_vars)
    if case.rename:
        hosts[case.rename] = hosts.pop("node01")
        data["all"]["children"]["sim"]["hosts"] = {case.rename: None, "node02": None}
    dest.write_text(yaml.safe_dump(data))
    return dest


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_value_is_never_executed(
    case: Case, fleet: SimFleet, bystanders: dict[str, list[int]], cli: Cli, tmp_path: Path
) -> None:
    for node in fleet.nodes:
        fleet.run_in(node.name, ["sh", "-c", "rm -f /tmp/pwned /tmp/echoed; : > /tmp/keep"])
        fleet.spawn(node.name, "sglang", gpus="0")
    inventory = _inventory(fleet, case, tmp_path / "inv.yml")
    book = "post-extraction"
    if case.playbook:
        (tmp_path / "book.yml").write_text(case.playbook)
        book = str(tmp_path / "book.yml")

    res = cli("run", book, "-i", inventory, "-e", "grace=0.5", "-e", "verify_timeout=2",
              *case.args, "--json")

    assert "Traceback" not in res.err
    assert res.code in (0, 1, 2, 4), res.err
    for node in fleet.nodes:
        assert not fleet.node_path(node.name, "/tmp/pwned").exists(), f"EXECUTED on {node}"
        assert fleet.node_path(node.name, "/tmp/keep").exists(), f"/tmp/keep gone on {node}"
        assert alive(fleet, node.name, bystanders[node.name]) == bystanders[node.name]
    if res.code != 4:
        for host in res.json()["hosts"]:
            signalled = {s["pid"] for s in host["signalled"]}
            node = "node01" if host["host"] == case.rename else host["host"]
            assert not signalled & set(bystanders[node])
    if case.id.startswith("shell-var"):
        echoed = fleet.node_path("node01", "/tmp/echoed").read_text()
        assert PWN in echoed, "the value arrives as data, byte for byte"
        if case.id == "shell-var-in-double-quotes":
            assert echoed == f'v="; {PWN}; " *\n', "inside \"...\": not split, not globbed"


def test_corpus_has_at_least_30_hostile_values() -> None:
    assert len(CASES) >= 30
