"""The problem lines under the table at scale: a rack that is down is one line, not a line
a host (issue #18: 1,000 hosts from one laptop), and nothing that differs is folded away."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from simhelp import Cli

from fleetclean.models import GpuRow, HostResult, HostStatus, ProcessRef, RunResult
from fleetclean.results import health, table


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


def _key(i: int, tail: str = "") -> HostResult:
    fp = "SHA256:" + (f"{i:02d}" * 22)[:43]
    return HostResult(f"gpu{i:02d}", HostStatus.HOST_KEY_MISMATCH,
                      f"unknown host key for 10.0.0.{i} (ssh-ed25519 {fp}); check it, then "
                      f"rerun with --accept-new-host-keys or add it to known_hosts{tail}",
                      where=f"10.0.0.{i}:22")


def test_a_fleet_not_yet_in_known_hosts_is_one_line_that_says_where_the_keys_are() -> None:
    # First contact with 1,000 new nodes: each has its own key, so each message differs
    # by its address and its key's fingerprint.
    assert _lines(*(_key(i) for i in range(1, 41))) == [
        "gpu[01-40]: host_key_mismatch: unknown host key for <address> (ssh-ed25519 "
        "<fingerprint>); check it, then rerun with --accept-new-host-keys or add it to "
        "known_hosts (each host's key: --json)"]
    # A key that changed on reinstalled hosts: both fingerprints are each host's own.
    changed = [HostResult(f"gpu0{i}", HostStatus.HOST_KEY_MISMATCH,
                          f"host key for 10.0.0.{i}:22 CHANGED (now SHA256:{'n' * 42}{i}, known "
                          f"SHA256:{'k' * 42}{i}); nothing was run", where=f"10.0.0.{i}:22")
               for i in (1, 2)]
    assert _lines(*changed) == [
        "gpu[01-02]: host_key_mismatch: host key for <address>:22 CHANGED (now <fingerprint>, "
        "known <fingerprint>); nothing was run (each host's key: --json)"]


def test_one_host_key_on_every_host_is_shown_not_folded_away() -> None:
    # A cloned image (or a man in the middle): every host presents the same key. The
    # addresses differ; the key is the same, and a person must see it.
    fp = "SHA256:" + "c" * 43
    same = [HostResult(f"gpu0{i}", HostStatus.HOST_KEY_MISMATCH,
                       f"unknown host key for 10.0.0.{i} (ssh-ed25519 {fp}); check it",
                       where=f"10.0.0.{i}:22") for i in (1, 2)]
    assert _lines(*same) == [f"gpu[01-02]: host_key_mismatch: unknown host key for <address> "
                             f"(ssh-ed25519 {fp}); check it"]


def test_a_cas_fingerprint_is_not_a_hosts_own() -> None:
    def refused(i: int, ca: str) -> HostResult:
        return HostResult(f"gpu0{i}", HostStatus.HOST_KEY_MISMATCH,
                          f"10.0.0.{i}:22: host certificate refused: its CA ssh-ed25519 "
                          f"SHA256:{ca * 43} is @revoked (known_hosts:3); nothing was run",
                          where=f"10.0.0.{i}:22")

    assert len(_lines(refused(1, "a"), refused(2, "b"))) == 2  # two CAs to act on
    assert _lines(refused(1, "a"), refused(2, "a")) == [
        f"gpu[01-02]: host_key_mismatch: <address>:22: host certificate refused: its CA "
        f"ssh-ed25519 SHA256:{'a' * 43} is @revoked (known_hosts:3); nothing was run"]


def test_hosts_named_by_a_number_or_a_word_of_their_message() -> None:
    # Host "1" and host "2": their counts are not their names.
    counted = [HostResult(name, HostStatus.ERROR, f"3 GPUs in use (+{name} more)")
               for name in ("1", "2")]
    assert len(_lines(*counted)) == 2
    # Host "a" said what "b" and "c" said: one line, its words.
    sudo = [HostResult(name, HostStatus.AUTH_FAILED, "sudo: a password is required")
            for name in ("a", "b", "c")]
    assert _lines(*sudo) == ["a,b,c: auth_failed: sudo: a password is required"]


def test_a_message_rewritten_after_the_run_is_folded_by_its_new_words() -> None:
    # The run's judgement of each host's past (expected_gpus) makes dirty hosts faulty and
    # puts the fault first: the folded words follow it.
    said = "GPU0 4096 MiB; held by {} python3 serve.py (root; GPU0)"
    dirty = [HostResult(f"gpu0{i}", HostStatus.DIRTY, said.format(40 + i),
                        gpus=tuple(GpuRow(g, f"G{i}{g}", "H200", 4096 * (g == 0), 143771)
                                   for g in range(gpus)),
                        error_folded=said.format("<pid>")) for i, gpus in ((1, 7), (2, 7), (3, 8))]
    judged = [health.judge(h, expected_gpus=8, since_epoch=None) for h in dirty]
    assert _lines(*judged) == [
        "gpu[01-02]: faulty: 7 GPU(s) visible, 8 expected (expected_gpus): a GPU is missing "
        "from the bus; GPU0 4096 MiB; held by <pid> python3 serve.py (root; GPU0) (each "
        "host's PIDs: --json)",
        f"gpu03: dirty: {said.format(43)}"]
    # A message changed without its folded words (no code does): its own words, a line each.
    stale = [dataclasses.replace(h, error=f"something else {i}") for i, h in enumerate(dirty)]
    assert _lines(*stale) == [f"gpu0{i + 1}: dirty: something else {i}" for i in range(3)]


def test_the_keys_a_login_offered_keep_hosts_apart_by_their_fingerprints() -> None:
    hosts = [HostResult(f"gpu0{i}", HostStatus.AUTH_FAILED,
                        f"authentication failed for root@10.0.0.{i}:22 with key "
                        f"SHA256:{c * 43}", where=f"10.0.0.{i}:22")
             for i, c in ((1, "a"), (2, "b"))]
    assert len(_lines(*hosts)) == 2


def test_messages_that_name_the_host_itself_share_a_line() -> None:
    timeout = [HostResult(f"gpu{i:02d}", HostStatus.TIMEOUT,
                          f"script still running on gpu{i:02d} after --timeout 60s; it goes on "
                          "there", where=f"10.0.0.{i}:22") for i in range(1, 13)]
    proxied = [HostResult(f"gpu{i:02d}", HostStatus.UNREACHABLE,
                          f"ProxyCommand 'ssh -W [10.0.0.{i}]:22 bastion': exited 255",
                          where=f"10.0.0.{i}:22") for i in (13, 14)]
    assert _lines(*timeout, *proxied) == [
        "gpu[01-12]: timeout: script still running on <host> after --timeout 60s; it goes on "
        "there",
        "gpu[13-14]: unreachable: ProxyCommand 'ssh -W [<address>]:22 bastion': exited 255"]


def test_a_name_inside_a_longer_name_is_not_taken_for_the_hosts() -> None:
    # node1's message names node10, node1-bmc and node1.example.com: other machines.
    for other in ("node{n}0", "node{n}-bmc", "node{n}.example.com", "10.0.0.{n}:2222",
                  "10.0.0.{n}2"):
        hosts = [HostResult(f"node{n}", HostStatus.ERROR, f"hop {other.format(n=n)} refused",
                            where=f"10.0.0.{n}:22") for n in (1, 2)]
        assert len(_lines(*hosts)) == 2, other
    # At the end of a sentence, a name stands whole.
    ended = [HostResult(f"node{i}", HostStatus.ERROR, f"connection to node{i} was cut.")
             for i in (1, 2)]
    assert _lines(*ended) == ["node[1-2]: error: connection to <host> was cut."]


def test_notes_that_differ_only_by_each_hosts_pids_share_a_line() -> None:
    # A teardown left each host's server parent running (a supervisor's): the same
    # process on every host, a PID of its own on each.
    hosts = [HostResult(f"gpu0{i}", HostStatus.CLEAN, left_running=(
        ProcessRef(1000 * i, "python3 -m sglang.launch_server --model /m"),))
        for i in (1, 2, 3)]
    other = HostResult("gpu04", HostStatus.CLEAN, left_running=(ProcessRef(9, "torchrun"),))
    assert _lines(*hosts, other) == [
        "gpu[01-03]: left running: <pid> python3 -m sglang.launch_server --model /m (parent "
        "of killed GPU holders) (each host's PIDs: --json)",
        "gpu04: left running: 9 torchrun (parent of killed GPU holders)"]


def test_a_dirty_message_folds_by_its_pids_only_where_the_run_said_which_they_are() -> None:
    said = "GPU0 4096 MiB; held by {} python3 serve.py (root; GPU0)"
    hosts = [HostResult(f"gpu0{i}", HostStatus.DIRTY, said.format(40 + i),
                        error_folded=said.format("<pid>")) for i in (1, 2)]
    assert _lines(*hosts) == ["gpu[01-02]: dirty: GPU0 4096 MiB; held by <pid> python3 "
                              "serve.py (root; GPU0) (each host's PIDs: --json)"]
    # Read back from a record (no folded words): each host's own line, as before.
    assert len(_lines(*(dataclasses.replace(h, error_folded=None) for h in hosts))) == 2


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
