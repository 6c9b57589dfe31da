"""--prom's file, read back with the official Prometheus client's text parser."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
from fleetclean.results import prom


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def result() -> RunResult:
    gpus = (GpuRow(0, "GPU-a", "NVIDIA H200", 0, 143771),
            GpuRow(1, "GPU-b", "NVIDIA H200", 40960, 143771),
            GpuRow(2, "GPU-c", "NVIDIA H200", None, None))  # [N/A]
    return RunResult("post-extraction", 3.5, (
        HostResult("gpu01", HostStatus.DIRTY, "still used", 2.25, gpus=gpus),
        HostResult('odd"host\\name\n', HostStatus.UNREACHABLE, "refused", 0.5),
        HostResult("gpu03", HostStatus.FAULTY, "GPU lost", 1.0),
    ))


def test_every_figure_of_the_result_is_read_back_by_the_official_parser() -> None:
    got = samples(prom.render(result(), now=1700000000.5))
    assert got[("fleetclean_gpu_memory_used_mib", (("gpu", "1"), ("host", "gpu01")))] == 40960
    assert got[("fleetclean_gpu_memory_used_mib", (("gpu", "0"), ("host", "gpu01")))] == 0
    assert got[("fleetclean_gpu_memory_total_mib", (("gpu", "1"), ("host", "gpu01")))] == 143771
    assert ("fleetclean_gpu_memory_used_mib", (("gpu", "2"), ("host", "gpu01"))) not in got
    assert got[("fleetclean_host_duration_seconds", (("host", "gpu01"),))] == 2.25
    assert got[("fleetclean_run_timestamp_seconds", ())] == 1700000000.5


def test_host_status_has_one_series_per_known_status_with_the_hosts_own_set_to_1() -> None:
    got = samples(prom.render(result(), now=0))
    for host, own in (("gpu01", "dirty"), ('odd"host\\name\n', "unreachable"),
                      ("gpu03", "faulty")):
        series = {dict(labels)["status"]: v for (name, labels), v in got.items()
                  if name == "fleetclean_host_status" and dict(labels)["host"] == host}
        assert set(series) == {s.value for s in HostStatus}
        assert series.pop(own) == 1 and set(series.values()) == {0}


def test_help_and_type_lines_name_every_family() -> None:
    families = {f.name: f for f in text_string_to_metric_families(prom.render(result(), now=0))}
    assert set(families) == {
        "fleetclean_gpu_memory_used_mib", "fleetclean_gpu_memory_total_mib",
        "fleetclean_host_status", "fleetclean_host_duration_seconds",
        "fleetclean_run_timestamp_seconds",
    }
    assert all(f.type == "gauge" and f.documentation for f in families.values())


def test_the_file_is_replaced_whole_and_no_temp_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "fleetclean.prom"
    target.write_text("old contents\n")
    os.chmod(target, 0o600)
    prom.write(result(), target, now=5)
    assert samples(target.read_text())[("fleetclean_run_timestamp_seconds", ())] == 5
    assert os.listdir(tmp_path) == ["fleetclean.prom"]
    assert target.stat().st_mode & 0o777 == 0o644  # the collector may run as another user


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "fleetclean.prom"
    target.write_text("old\n")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prom.os, "replace", refuse)
    with pytest.raises(OSError):
        prom.write(result(), target, now=5)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["fleetclean.prom"]
