"""People a node knows only from its directory service, as on a real cluster (LDAP, SSSD):
on the simulated node, carol is served by a real NSS module (libnss-extrausers) and is in no
/etc/passwd. The GPU table names her processes by her name, as ``ps`` would, not by her
UID; ``--user carol`` signals hers only; a UID nobody knows stays a number."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, alive, spawn_holder

from fleetclean.sim import SimFleet, accounts

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(not accounts.has_directory(),
                       reason="needs libnss-extrausers (scripts/dev setup installs it)"),
]
UNKNOWN_UID = 4242
FAST = ("-e", "grace=1", "-e", "verify_timeout=1")


def users_by_pid(host: dict[str, Any]) -> dict[int, str]:
    return {p["pid"]: p["user"] for g in host["gpus"] for p in g["processes"]}


def test_a_directory_users_processes_carry_her_name_and_her_scope(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    # What a real cluster node is like: NSS knows her, /etc/passwd does not.
    known = fleet.run_in("node01", ["getent", "passwd", "carol"]).stdout
    assert known.startswith("carol:x:2604:")
    assert "carol" not in fleet.run_in("node01", ["cat", "/etc/passwd"]).stdout
    carols = fleet.spawn("node01", "stubborn", gpu=1, mib=2048, user="carol")
    roots = fleet.spawn("node01", "stubborn", gpu=4, mib=1024)
    stranger = spawn_holder(fleet, "node01", UNKNOWN_UID, UNKNOWN_UID, gpu=6, mib=512,
                            name="holder-of-nobody-known")

    status = cli("status", "-i", fleet.inventory_path, "--json")
    assert status.code == 1, status.out  # dirty: three GPUs in use
    users = users_by_pid(status.host("node01"))
    assert users[carols[0]] == "carol"
    assert users[roots[0]] == "root"
    assert users[stranger] == str(UNKNOWN_UID)
    table = cli("status", "-i", fleet.inventory_path)
    assert f"{carols[0]} " in table.out and "carol" in table.out

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--user", "carol", *FAST,
              "--json")
    # A stubborn holder: SIGTERM, then SIGKILL.
    assert {s["pid"] for s in res.host("node01")["signalled"]} == set(carols)
    assert alive(fleet, "node01", [*carols, roots[0], stranger]) == [roots[0], stranger]


def test_a_passwd_with_nis_compat_lines_still_names_every_user(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    """NIS's compat lines ("+::::::", "+@admins::::::") carry no UID: a status on a node
    whose /etc/passwd holds them names its GPUs' users from the file and the directory."""
    fleet = sim_fleet_factory(1)
    fleet.run_in("node01", ["sh", "-c", "printf '+@admins::::::\\n+::::::\\n' >> /etc/passwd"])
    # Five users: the fourth and fifth are read from the whole file (lib.sh).
    pids = {user: fleet.spawn("node01", "stubborn", gpu=gpu, mib=512, user=user)[0]
            for gpu, user in enumerate(["root", "ops", "alice", "bob", "carol"])}
    stranger = spawn_holder(fleet, "node01", UNKNOWN_UID, UNKNOWN_UID, gpu=6, mib=512,
                            name="holder-of-nobody-known")
    for _ in range(2):  # a host never seen, then one seen in use (its users named early)
        status = cli("status", "-i", fleet.inventory_path, "--json")
        assert status.code == 1, status.out
        users = users_by_pid(status.host("node01"))
        assert {user: users[pid] for user, pid in pids.items()} == {u: u for u in pids}
        assert users[stranger] == str(UNKNOWN_UID)
