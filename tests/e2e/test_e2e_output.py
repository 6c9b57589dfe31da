"""Output for logs and metrics, end to end on the simulated fleet, through real pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simhelp import alive

pytestmark = pytest.mark.sim


def fleetclean(state: Path, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess whose stdout and stderr are pipes, as in CI or `| tee`."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(FLEETCLEAN_STATE_DIR=str(state), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "fleetclean", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def test_a_300_character_record_path_and_the_table_are_not_wrapped_in_a_pipe(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    fleet.spawn("node01", "sglang", gpus="0")
    state = tmp_path / ("d" * 120) / ("e" * 120) / "state"
    res = fleetclean(state, "run", "post-extraction", "-i", fleet.inventory_path)
    assert res.returncode == 0, res.stderr
    [record] = (state / "runs").glob("*.json")
    assert len(str(record)) >= 300
    assert f"record: {record}\n" in res.stderr
    lines = res.stdout.splitlines()
    assert any(line.split()[:1] == ["node01"] and line.split()[-1] == "clean" for line in lines)
    assert lines[-1].startswith("1 host: 1 clean, 0 dirty, 0 failed in ")


def test_the_prom_file_matches_the_json_figures(sim_fleet_factory, tmp_path: Path) -> None:
    fleet = sim_fleet_factory(2)
    fleet.spawn("node02", "stubborn", gpu=3)  # a held GPU: status only looks
    prom = tmp_path / "textfile" / "fleetclean.prom"
    prom.parent.mkdir()
    res = fleetclean(tmp_path / "state", "status", "-i", fleet.inventory_path, "--json",
                     "--prom", prom)
    data = json.loads(res.stdout)
    assert res.returncode == 1 and data["summary"]["dirty"] == 1, res.stderr
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(prom.read_text()) for s in f.samples}
    for host in data["hosts"]:
        for gpu in host["gpus"]:
            key = (("gpu", str(gpu["index"])), ("host", host["host"]))
            assert got[("fleetclean_gpu_memory_used_mib", key)] == gpu["memory_used_mib"]
            assert got[("fleetclean_gpu_memory_total_mib", key)] == gpu["memory_total_mib"]
        assert len(host["gpus"]) == 8
        assert got[("fleetclean_host_status",
                    (("host", host["host"]), ("status", host["status"])))] == 1
        assert got[("fleetclean_host_duration_seconds",
                    (("host", host["host"]),))] == pytest.approx(host["duration_s"])
    held = (("gpu", "3"), ("host", "node02"))
    assert got[("fleetclean_gpu_memory_used_mib", held)] > 0
    assert os.listdir(prom.parent) == ["fleetclean.prom"]


def test_a_prom_file_in_a_missing_directory_is_bad_input_before_anything_is_sent(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "sglang", gpus="0")
    res = fleetclean(tmp_path / "state", "run", "post-extraction", "-i", fleet.inventory_path,
                     "--prom", tmp_path / "nope" / "x.prom")
    assert res.returncode == 4 and res.stderr.count("\n") == 1
    assert "does not exist" in res.stderr
    assert alive(fleet, "node01", server) == server  # nothing was sent


def test_a_full_disk_under_the_output_is_a_failure_named_in_one_line(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    for extra in ([], ["--json"]):
        with open("/dev/full", "w") as full:
            res = subprocess.run(
                [sys.executable, "-m", "fleetclean", "status", "-i", str(fleet.inventory_path),
                 *extra], stdout=full, stderr=subprocess.PIPE, text=True, timeout=240,
                env={**os.environ, "FLEETCLEAN_STATE_DIR": str(tmp_path / "state")},
                check=False)
        assert res.returncode == 2, res.stderr
        assert res.stderr == ("fleetclean: error: the result could not be written to "
                              "standard output: No space left on device\n")


def test_a_reader_that_goes_away_leaves_the_status_to_the_hosts(
    sim_fleet_factory, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(2)
    for extra in ([], ["--json"]):  # rich's table, and the JSON
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetclean", "status", "-i", str(fleet.inventory_path),
             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "FLEETCLEAN_STATE_DIR": str(tmp_path / "state")})
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the result is written: `| true`
        err = proc.stderr.read()
        # Both hosts are clean: 0. rich ended the process with 1 ("dirty") by itself.
        assert proc.wait(timeout=240) == 0, (extra, err)
        assert err == b""


# The CLI run as `fleetclean`, noting whether rich (the table, the live view: 35-70 ms of
# imports) had been imported once the transport was (fabric, paramiko: the session made,
# just before the hosts are handed out): the two imports shared the one interpreter and
# put the first connection that much later.
FIRST_CONNECT = """
import sys
from fleetclean import fleet
made = fleet._session
def session(*args, **kwargs):
    got = made(*args, **kwargs)
    sys.stderr.write("rich with the transport: %s\\n" % ("rich" in sys.modules))
    return got
fleet._session = session
sys.argv = ["fleetclean"] + sys.argv[1:]
from fleetclean.cli import entry
entry()
"""


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_rich_is_imported_after_the_transport_and_the_view_and_table_still_come(
    sim_fleet_factory, tmp_path: Path, terminal: bool
) -> None:
    fleet = sim_fleet_factory(2)
    fleet.spawn("node02", "stubborn", gpu=3)
    # The run outlasts rich's import, however loaded this machine: the view draws before
    # the run's end (a view whose run ended first is rightly never drawn).
    fleet.set_fault("node02", "slow-auth", 1.5)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    # TTY_COMPATIBLE=1: rich draws on the pipe as on a terminal (the live view), as a
    # person's run does.
    env.update(FLEETCLEAN_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1",
               TTY_COMPATIBLE="1" if terminal else "0")
    res = subprocess.run([sys.executable, "-c", FIRST_CONNECT, "status", "-i",
                          str(fleet.inventory_path)], env=env, capture_output=True,
                         text=True, timeout=240, check=False)
    assert res.returncode == 1, res.stderr
    assert "rich with the transport: False" in res.stderr.splitlines(), res.stderr
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line.strip()}
    assert rows["node01"][-1] == "clean" and rows["node02"][-1] == "dirty", res.stdout
    if terminal:  # the live view drew (its last frame: both hosts done)
        assert "2/2 hosts done" in res.stderr, res.stderr
