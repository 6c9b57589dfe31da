"""Parsers and the --json contract on outputs read off a real H200 (tests/data/gpu/h200/,
written by tests/gpu/gpu_check.py on the lent GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetclean.results.nvsmi import APP_FIELDS, parse_compute_apps, parse_query_gpu

DATA = Path(__file__).parent.parent / "data" / "gpu" / "h200"
GPU_FIELDS = ["index", "uuid", "name", "memory.used", "memory.total"]
UUID = "GPU-84f78930-acf1-f90f-6f09-f75a531bc42e"


def text(name: str) -> str:
    """A fixture without its trailing ``__rc=N`` line (not nvidia-smi's output)."""
    lines = (DATA / name).read_text().splitlines(keepends=True)
    assert lines[-1].startswith("__rc=")
    return "".join(lines[:-1])


def test_query_gpu_while_a_server_held_50_gib() -> None:
    (row,) = parse_query_gpu(text("q_held.txt"), GPU_FIELDS, nounits=True, header=False)
    assert (row.index, row.uuid, row.name) == (0, UUID, "NVIDIA H200")
    assert (row.memory_used_mib, row.memory_total_mib) == (50387, 143771)


def test_query_gpu_with_units() -> None:
    (row,) = parse_query_gpu(text("q_held_units.txt"), GPU_FIELDS, nounits=False, header=False)
    assert row.memory_used_mib == 50387


@pytest.mark.parametrize("name", ["q_idle.txt", "q_after.txt"])
def test_idle_h200_reads_zero(name: str) -> None:
    (row,) = parse_query_gpu(text(name), GPU_FIELDS, nounits=True, header=False)
    assert row.memory_used_mib == 0


@pytest.mark.parametrize("name,nounits", [("apps_held.txt", True),
                                           ("apps_held_units.txt", False)])
def test_compute_apps_name_the_server_and_its_worker(name: str, nounits: bool) -> None:
    apps = parse_compute_apps(text(name), [*APP_FIELDS, "gpu_bus_id"], nounits=nounits)
    assert [(a.pid, a.used_memory_mib) for a in apps] == [(880, 41570), (901, 8802)]
    assert {a.gpu_uuid for a in apps} == {UUID}
    # the real driver reports the executable's full path here, not just "python3"
    assert apps[0].name == "/opt/torch/.venv/bin/python3"


@pytest.mark.parametrize("name", ["apps_idle.txt", "apps_after.txt"])
def test_no_compute_apps_when_idle(name: str) -> None:
    assert parse_compute_apps(text(name), [*APP_FIELDS, "gpu_bus_id"]) == []


def test_recorded_teardown_follows_the_contract_and_freed_the_gpu() -> None:
    data = json.loads((DATA / "teardown.json").read_text())
    assert data["summary"] == {"hosts": 1, "clean": 1, "dirty": 0, "failed": 0}
    host = data["hosts"][0]
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0]
    assert {s["pid"] for s in host["signalled"]} == {880, 901}
    assert all("--marker fcgpu-" in s["cmdline"] for s in host["signalled"])


def test_recorded_status_saw_the_held_memory_and_check_changed_nothing() -> None:
    status = json.loads((DATA / "status_held.json").read_text())
    assert status["hosts"][0]["status"] == "dirty"
    assert status["hosts"][0]["gpus"][0]["memory_used_mib"] == 50387
    check = json.loads((DATA / "check.json").read_text())
    assert check["hosts"][0]["signalled"] == []


def test_summary_of_the_real_gpu_run() -> None:
    summary = json.loads((DATA / "summary.json").read_text())
    assert summary["ok"] is True and all(summary["checks"].values())
    assert summary["after_mib"] == summary["idle_mib"] == [0]


X2 = Path(__file__).parent.parent / "data" / "gpu" / "h200x2"


def test_status_on_a_two_gpu_machine_lists_every_gpu() -> None:
    (host,) = json.loads((X2 / "status_all.json").read_text())["hosts"]
    assert host["status"] == "clean"
    assert [(g["index"], g["memory_used_mib"], g["memory_total_mib"]) for g in host["gpus"]] == [
        (0, 0, 143771), (1, 0, 143771)]
    rows = parse_query_gpu("".join((X2 / "q_idle.txt").read_text().splitlines(True)[:-1]),
                           GPU_FIELDS, nounits=True, header=False)
    assert [g.uuid for g in rows] == [g["uuid"] for g in host["gpus"]]
    table = (X2 / "status_all.txt").read_text()
    assert "GPU0  GPU1" in table and "1 hosts: 1 clean" in table


def test_teardown_on_the_two_gpu_machine_freed_only_gpu0_it_held() -> None:
    summary = json.loads((X2 / "summary.json").read_text())
    assert summary["held_mib"][0] > 40000 and summary["held_mib"][1] == 0
    assert summary["after_mib"] == [0, 0] and summary["ok"] is True
    teardown = json.loads((X2 / "teardown.json").read_text())
    assert teardown["summary"]["clean"] == 1


NONROOT = Path(__file__).parent.parent / "data" / "nvidia-smi" / "h100-nonroot"


def _captured(name: str) -> str:
    return (NONROOT / name).read_text().rsplit("__rc=", 1)[0]


def test_an_unprivileged_users_nvidia_smi_lists_every_users_processes_as_roots_does() -> None:
    # Read off a real H100 as root and as `nobody`: nvidia-smi asks the driver, which
    # knows every context; only /proc (fuser) is narrowed to the user's own processes.
    fields = [*APP_FIELDS, "gpu_bus_id"]
    as_root = parse_compute_apps(_captured("apps_root.txt"), fields, nounits=False)
    as_user = parse_compute_apps(_captured("apps_nobody.txt"), fields, nounits=False)
    assert [(a.pid, a.name, a.used_memory_mib) for a in as_user] == [
        (870, "python3", 2658), (869, "python3", 4706),
        (920, "/opt/torch/.venv/bin/python3", 1634)]
    assert as_user == as_root
    assert "869" in _captured("fuser_root.txt") and "869" not in _captured("fuser_nobody.txt")
