"""The teardown engine over real SSH on simulated nodes: what the seeds did by hand, done
right. Each test asserts what a user cares about: the process is gone, the protected one
still runs, the file was restored, the table shows 0 MiB."""

from __future__ import annotations

import pytest
from simhelp import Cli, alive

pytestmark = pytest.mark.sim


def test_sglang_orphan_stubborn_and_slow_are_all_gone_and_gpus_free(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang")
    orphan = fleet.spawn("node01", "orphan", gpu=3)
    stubborn = fleet.spawn("node01", "stubborn", gpu=5)
    slow = fleet.spawn("node01", "slow", gpu=6, delay=1)
    assert all(mib > 0 for mib in fleet.gpu_used_mib("node01"))

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=3", "--json")

    assert res.code == 0, res.err + res.out
    host = res.host("node01")
    assert host["status"] == "clean"
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0] * 8
    assert fleet.gpu_used_mib("node01") == [0] * 8
    assert alive(fleet, "node01", server + orphan + stubborn + slow) == []
    signals = {(s["pid"], s["signal"]) for s in host["signalled"]}
    assert (stubborn[0], "KILL") in signals, "stubborn ignores SIGTERM: it needed SIGKILL"
    assert (slow[0], "TERM") in signals
    assert (slow[0], "KILL") not in signals, "slow exits within grace: waited for, not killed"


def test_a_teardown_whose_gpus_read_clean_after_the_kills_asks_nvidia_smi_once(
    sim_fleet_factory, cli: Cli
) -> None:
    # The gpu-holders stage's read serves the verification (verify.sh: fc_verify_keep):
    # the kills come before it, and nothing after it may change a GPU.
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang")
    calls = fleet.node_path("node01", "/run/fleetclean/calls")
    calls.write_text("")

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=3", "--json")

    assert res.code == 0, res.err + res.out
    assert res.host("node01")["status"] == "clean"
    assert alive(fleet, "node01", server) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    asked = calls.read_text().splitlines()[:-1]  # the last: gpu_used_mib's own query
    assert len(asked) == 1 and asked[0].startswith("-q -d MEMORY,PIDS"), asked


@pytest.mark.parametrize("playbook", ["post-extraction", "pre-restart", "free-gpus", "status"])
def test_monitor_and_persistenced_survive_every_builtin_playbook(
    sim_fleet_factory, cli: Cli, playbook: str
) -> None:
    fleet = sim_fleet_factory(1)
    keep = fleet.spawn("node01", "monitor") + fleet.spawn("node01", "persistenced")
    fleet.spawn("node01", "sglang", gpus="0-1")

    res = cli("run", playbook, "-i", fleet.inventory_path, "-e", "grace=1", "--json")

    assert alive(fleet, "node01", keep) == keep
    signalled = {s["pid"] for s in res.host("node01")["signalled"]}
    assert not signalled & set(keep)
    if playbook == "status":
        assert signalled == set()
        assert res.code == 1  # GPUs still held: dirty, and nothing touched
    else:
        assert res.code == 0, res.out


def test_pattern_matching_the_teardowns_own_shell_does_not_kill_it(
    sim_fleet_factory, cli: Cli
) -> None:
    """The seeds' failure: `ssh host "pkill -f sglang; ..."` kills its own bash -c, so later
    stages never run. Here the pattern matches the remote bash and sshd: they are spared."""
    fleet = sim_fleet_factory(1)
    fleet.spawn("node01", "sglang", gpus="0-3")
    res = cli("run", "post-extraction", "-i", fleet.inventory_path,
              "-e", "server_pattern=bash|sshd", "-e", "grace=1", "--json")
    host = res.host("node01")
    assert [s["name"] for s in host["stages"]] == [
        "guard-writers", "stop-server", "kill-workers", "kill-gpu-holders", "reset-leaked",
        "restore-model", "remove-dump",
    ]
    assert host["status"] == "clean"
    assert fleet.sshd_up("node01")


def test_restore_puts_the_model_file_back(sim_fleet_factory, cli: Cli) -> None:
    fleet = sim_fleet_factory(1)
    model = "/tmp/sglang/models/deepseek_v2.py"
    fleet.run_in("node01", ["mkdir", "-p", "/tmp/sglang/models"])
    fleet.node_path("node01", model).write_text("patched: dump hidden states\n")
    fleet.node_path("node01", model + ".bak_hsdump").write_text("original\n")

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", f"model_file={model}",
              "--json")

    assert res.code == 0, res.out
    assert fleet.node_path("node01", model).read_text() == "original\n"


def test_restore_without_backup_fails_clearly_and_keeps_the_file(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    model = "/tmp/deepseek_v2.py"
    fleet.node_path("node01", model).write_text("patched\n")

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", f"model_file={model}",
              "--json")

    host = res.host("node01")
    assert res.code == 2
    assert host["status"] == "error"
    assert "/tmp/deepseek_v2.py.bak_hsdump" in host["error"]
    assert fleet.node_path("node01", model).read_text() == "patched\n"


def test_remove_deletes_the_dump_dir(sim_fleet_factory, cli: Cli) -> None:
    fleet = sim_fleet_factory(1)
    fleet.run_in("node01", ["mkdir", "-p", "/dev/shm/sglang_hs/part0"])
    fleet.node_path("node01", "/dev/shm/sglang_hs/part0/x.pt").write_text("x")

    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")

    assert res.code == 0
    assert not fleet.node_path("node01", "/dev/shm/sglang_hs").exists()


def test_guard_refuses_while_a_writer_runs_and_nothing_is_signalled(
    sim_fleet_factory, cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang", gpus="0-1")
    fleet.spawn("node01", "writer", path="/dev/shm/sglang_hs")

    res = cli("run", "post-extraction", "-i", fleet.inventory_path,
              "-e", "guard_path=/dev/shm/sglang_hs", "--json")

    host = res.host("node01")
    assert res.code == 2
    assert "writ" in host["error"]
    assert host["signalled"] == []
    assert alive(fleet, "node01", server) == server
    assert fleet.node_path("node01", "/dev/shm/sglang_hs").exists()


HOSTILE = [
    "'; touch /tmp/pwned #",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "x\ntouch /tmp/pwned",
    '"; touch /tmp/pwned; echo "',
    "*",
    "/tmp/* ; touch /tmp/pwned",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_variables_are_passed_literally(
    sim_fleet_factory, cli: Cli, value: str
) -> None:
    fleet = sim_fleet_factory(1)
    keep = fleet.spawn("node01", "monitor")
    for var in ("server_pattern", "model_file", "dump_dir", "protect"):
        cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", f"{var}={value}",
            "-e", "grace=0.5", "--json")
    assert not fleet.node_path("node01", "/tmp/pwned").exists()
    assert alive(fleet, "node01", keep) == keep


def test_a_background_process_left_by_a_shell_stage_does_not_hold_the_run(
    sim_fleet_factory, cli: Cli, tmp_path
) -> None:
    """A relaunch in a shell stage (`server &`) keeps the SSH channel open after the script
    ends; the run must still finish, not wait out --timeout."""
    fleet = sim_fleet_factory(1)
    book = tmp_path / "relaunch.yaml"
    book.write_text(
        "name: relaunch\n"
        "description: start something in the background\n"
        "stages:\n"
        "  - name: start\n"
        "    type: shell\n"
        "    command: \"sleep 60 &\"\n"
    )
    res = cli("run", book, "-i", fleet.inventory_path, "--timeout", "30", "--json")
    assert res.code == 0, res.out
    assert res.host("node01")["status"] == "clean"
