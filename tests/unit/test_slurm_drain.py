"""--drain-dirty / --resume-clean decisions, with Slurm's side recorded instead of run."""

from __future__ import annotations

from pathlib import Path

import pytest
from simhelp import Cli

from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results import jsonio
from fleetclean.slurm import drain
from fleetclean.slurm.nodes import NodeState, SlurmUnavailable


class FakeSlurm:
    def __init__(self, states: dict[str, tuple[str, str]]) -> None:
        self.nodes = {n: NodeState(n, s, r) for n, (s, r) in states.items()}
        self.updates: list[tuple[str, ...]] = []
        self.fail = False

    def query(self) -> dict[str, NodeState]:
        return dict(self.nodes)

    def update(self, node: str, *settings: str) -> None:
        if self.fail:
            raise SlurmUnavailable("scontrol failed: Invalid user for SlurmUser root")
        self.updates.append((node, *settings))
        if "State=DRAIN" in settings:
            reason = settings[1].removeprefix("Reason=")
            self.nodes[node] = NodeState(node, "drained", reason)
        else:
            self.nodes[node] = NodeState(node, "idle", "")


def run(
    slurm: FakeSlurm, *hosts: HostResult, drain_: bool = True, resume: bool = True
) -> RunResult:
    result = RunResult("post-extraction", 1.0, hosts)
    return drain.apply(result, drain=drain_, resume=resume, run_id="R9",
                       query=slurm.query, update=slurm.update)


def test_a_dirty_idle_node_is_drained_with_the_reason_and_both_states() -> None:
    slurm = FakeSlurm({"gpu01": ("idle", "")})
    out = run(slurm, HostResult("gpu01.lab", HostStatus.DIRTY, error="GPU2 4096 MiB"))
    assert slurm.updates == [("gpu01", "State=DRAIN", "Reason=fleetclean R9: dirty: GPU2 4096 MiB")]
    data = jsonio.host_json(out.hosts[0])["slurm"]
    assert data == {"action": "drain", "state_before": "idle", "state_after": "drained",
                    "reason": "fleetclean R9: dirty: GPU2 4096 MiB"}
    assert jsonio.from_json(jsonio.to_json(out)) == out


def test_controller_side_failures_and_busy_nodes_are_never_drained() -> None:
    slurm = FakeSlurm({f"gpu0{i}": ("idle", "") for i in range(1, 5)} | {"gpu05": ("mixed", "")})
    hosts = [HostResult(f"gpu0{i}", status) for i, status in enumerate(
        (HostStatus.UNREACHABLE, HostStatus.AUTH_FAILED, HostStatus.HOST_KEY_MISMATCH,
         HostStatus.TIMEOUT), 1)]
    out = run(slurm, *hosts, HostResult("gpu05", HostStatus.DIRTY))
    assert slurm.updates == []
    assert [h.slurm.action for h in out.hosts if h.slurm] == ["none"] * 5


def test_only_nodes_fleetclean_drained_are_resumed() -> None:
    slurm = FakeSlurm({"a": ("drained", "fleetclean R1: faulty: GPU3 lost"),
                       "b": ("drained*", "bad DIMM"), "c": ("drained", "fleetclean R1: dirty")})
    out = run(slurm, HostResult("a", HostStatus.CLEAN), HostResult("b", HostStatus.CLEAN),
              HostResult("c", HostStatus.DIRTY))
    assert slurm.updates == [("a", "State=RESUME")]
    assert [(h.slurm.action, h.slurm.state_after) for h in out.hosts if h.slurm] == [
        ("resume", "idle"), ("none", "drained*"), ("none", "drained")]


def test_a_host_slurm_does_not_know_gets_no_slurm_key() -> None:
    out = run(FakeSlurm({"gpu01": ("idle", "")}), HostResult("login", HostStatus.DIRTY))
    assert "slurm" not in jsonio.host_json(out.hosts[0])


def test_a_failed_scontrol_is_an_error_action_not_a_crash() -> None:
    slurm = FakeSlurm({"gpu01": ("idle", "")})
    slurm.fail = True
    out = run(slurm, HostResult("gpu01", HostStatus.FAULTY, error="GPU3 lost"))
    assert out.hosts[0].slurm is not None
    assert out.hosts[0].slurm.action == "error"
    assert "Invalid user" in out.hosts[0].slurm.reason


def test_drain_dirty_without_slurm_here_is_refused_before_anything_is_sent(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = cli("status", "-i", "gpu01,", "-F", "", "--drain-dirty")
    assert result.code == 4
    assert "scontrol/sinfo not found" in result.err
    assert "gpu01" not in result.out


def test_resume_clean_does_not_go_with_watch(cli: Cli) -> None:
    result = cli("status", "-i", "gpu01,", "-F", "", "--resume-clean", "--watch", "1")
    assert result.code == 4
    assert "--watch" in result.err
