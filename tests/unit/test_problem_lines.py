"""The problem lines under the table at scale: a rack that is down is one line, not a line
a host (issue #18: 1,000 hosts from one laptop), and nothing that differs is folded away."""

from __future__ import annotations

from pathlib import Path

import yaml
from simhelp import Cli

from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results import table


def _down(i: int, words: str = "connection refused", port: int = 22) -> HostResult:
    where = f"10.0.0.{i}:{port}"
    return HostResult(f"gpu{i:02d}", HostStatus.UNREACHABLE,
                      f"cannot connect to {where}: {words}", where=where)


def _lines(*hosts: HostResult) -> list[str]:
    return table.problems(RunResult("status", 1.0, hosts))


def test_hosts_whose_messages_differ_only_by_their_own_address_share_a_line() -> None:
    assert _lines(*(_down(i) for i in range(1, 41))) == [
        "gpu[01-40]: unreachable: cannot connect to <address>:22: connection refused"]


def test_what_else_differs_keeps_its_own_line() -> None:
    lines = _lines(_down(1), _down(2), _down(3, "no route to host"), _down(4, port=2222))
    assert lines == [
        "gpu[01-02]: unreachable: cannot connect to <address>:22: connection refused",
        "gpu03: unreachable: cannot connect to 10.0.0.3:22: no route to host",
        "gpu04: unreachable: cannot connect to 10.0.0.4:2222: connection refused"]


def test_an_address_inside_a_longer_one_is_not_taken_for_the_hosts() -> None:
    # Each host names a longer address built on its own: its port's prefix (10.0.0.1:2222),
    # another address ending in its own (110.0.0.1:22, IPv6's 1:fe80::1:22). Folding those
    # would merge hosts behind different hops.
    for longer in ("{a}:2222", "1{a}:22", "1:{a}:22"):
        hosts = [HostResult(f"gpu0{i}", HostStatus.ERROR,
                            f"hop {longer.format(a=address)} refused", where=f"{address}:22")
                 for i, address in ((1, "10.0.0.1"), (2, "10.0.0.2"))]
        assert len(_lines(*hosts)) == 2, longer
    v6 = [HostResult(f"gpu0{i}", HostStatus.UNREACHABLE,
                     f"cannot connect to fe80::{i}:22: connection refused", where=f"fe80::{i}:22")
          for i in (1, 2)]
    assert _lines(*v6) == ["gpu[01-02]: unreachable: cannot connect to <address>:22: "
                           "connection refused"]


def test_users_keys_and_fingerprints_keep_hosts_apart() -> None:
    hosts = [HostResult(f"gpu0{i}", HostStatus.AUTH_FAILED,
                        f"authentication failed for {user}@10.0.0.{i}:22 with key {key}: "
                        "Authentication failed.", where=f"10.0.0.{i}:22")
             for i, user, key in ((1, "root", "~/.ssh/a"), (2, "ops", "~/.ssh/a"),
                                  (3, "root", "~/.ssh/b"), (4, "root", "~/.ssh/a"))]
    assert _lines(*hosts) == [
        "gpu[01,04]: auth_failed: authentication failed for root@<address>:22 with key "
        "~/.ssh/a: Authentication failed.",
        "gpu02: auth_failed: authentication failed for ops@10.0.0.2:22 with key ~/.ssh/a: "
        "Authentication failed.",
        "gpu03: auth_failed: authentication failed for root@10.0.0.3:22 with key ~/.ssh/b: "
        "Authentication failed."]


def test_results_read_back_without_their_address_keep_a_line_a_host() -> None:
    hosts = [HostResult(f"gpu0{i}", HostStatus.UNREACHABLE,
                        f"cannot connect to 10.0.0.{i}:22: connection refused") for i in (1, 2)]
    assert len(_lines(*hosts)) == 2


def test_a_status_of_hosts_that_refuse_says_so_once(cli: Cli, tmp_path: Path) -> None:
    """Through the CLI, over real TCP: three loopback addresses where nothing listens."""
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {
        f"rack{i}": {"ansible_host": f"127.0.0.{i + 2}", "ansible_port": 1,
                     "ansible_user": "root"} for i in range(3)}}}))
    res = cli("status", "-i", inv, "-F", "", "--connect-timeout", "3")
    assert res.code == 2, res.err
    said = [line for line in res.out.splitlines() if ": unreachable: " in line]
    assert said == ["rack[0-2]: unreachable: cannot connect to <address>:1: connection refused"]
