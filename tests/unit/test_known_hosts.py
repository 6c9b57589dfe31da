"""Which known_hosts files a run reads and writes (``transport/hostkeys.py``)."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from fleetclean.transport.hostkeys import KnownHostsCache


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$HOME, with an empty ~/.ssh: the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def test_an_extra_file_adds_to_the_users_own_and_takes_the_new_keys(home: Path) -> None:
    # --known-hosts FILE replaced ~/.ssh/known_hosts: a host whose key changed there read
    # as a new host, and --accept-new-host-keys accepted its new key and ran the script.
    tmp_path = home
    known_key, new_key = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    own = tmp_path / ".ssh" / "known_hosts"
    own.write_text(f"gpu01 ssh-rsa {known_key.get_base64()}\n")
    extra = tmp_path / "fleet_known_hosts"
    extra.write_text("")
    known = KnownHostsCache((str(extra),)).get(None)
    found = known.keys.lookup("gpu01")
    assert found is not None and found["ssh-rsa"].get_base64() == known_key.get_base64()
    known.record("gpu02", new_key)
    assert "gpu02" in extra.read_text() and "gpu02" not in own.read_text()
    # UserKnownHostsFile from ssh_config stands for ~/.ssh/known_hosts, as in OpenSSH.
    config_file = tmp_path / "config_known"
    config_file.write_text("")
    assert KnownHostsCache(()).get(str(config_file)).keys.lookup("gpu01") is None


def test_a_hashed_entry_is_judged_by_the_key_shown_changed_or_listed(home: Path) -> None:
    # Hashed names (HashKnownHosts yes) were hashed again for every entry at every lookup:
    # 7 s of controller CPU for 1,024 hosts. The policy now hashes a name only against the
    # entries of the key the host shows; a changed key is still told from a new host.
    from fleetclean.transport.hostkeys import Policy, UnknownHostKey

    tmp_path = home
    listed, changed = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    (tmp_path / ".ssh" / "known_hosts").write_text(
        f"{paramiko.HostKeys.hash_host('10.0.0.7')} ssh-rsa {listed.get_base64()}\n")
    known = KnownHostsCache(()).get(None)
    assert known.store.get("10.0.0.7") is None  # hashed: the policy judges
    policy = Policy(known, accept_new=True)
    policy.missing_host_key(None, "10.0.0.7", listed)  # type: ignore[arg-type]
    with pytest.raises(paramiko.BadHostKeyException):
        policy.missing_host_key(None, "10.0.0.7", changed)  # type: ignore[arg-type]
    with pytest.raises(UnknownHostKey):
        Policy(known, accept_new=False).missing_host_key(
            None, "10.0.0.8", changed)  # type: ignore[arg-type]


def test_host_names_are_matched_in_any_case_as_by_ssh(home: Path) -> None:
    # ssh's match_hostname lower-cases the name and the pattern: `GPU-TUNNEL-8` in
    # known_hosts is gpu-tunnel-8's line; fleetclean called its key unknown, and
    # --accept-new-host-keys appended a second line. A hashed name is the lower-cased
    # name's hash (ssh hashes the name it connects to in lower case), and a new key is
    # recorded in lower case, as ssh writes it.
    from fleetclean.transport.hostkeys import Policy

    listed, other = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    own = home / ".ssh" / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("node09.lab")
    line = f"ecdsa-sha2-nistp256 {listed.get_base64()}\n"
    own.write_text(f"GPU-TUNNEL-8,Node07.Lab {line}{hashed} {line}"
                   f"{paramiko.HostKeys.hash_host('NODE10')} {line}")
    known = KnownHostsCache(()).get(None)
    for name in ("gpu-tunnel-8", "GPU-Tunnel-8", "node07.lab", "NODE09.LAB"):
        assert known.judge(name, listed), name
        with pytest.raises(paramiko.BadHostKeyException):
            known.judge(name, other)
    assert known.judge("gpu-tunnel-8", listed, aliased=True)
    assert known.store.get("Node07.LAB") is None  # hashed lines: the policy judges
    assert not known.judge("node10", listed), "a name hashed in capitals ssh never asks for"
    kept = own.read_text()
    Policy(known, accept_new=True, alias="gpu-tunnel-8").missing_host_key(
        None, "10.0.0.8", listed)  # type: ignore[arg-type]
    assert own.read_text() == kept
    Policy(known, accept_new=True).missing_host_key(
        None, "[GPU-11]:2222", listed)  # type: ignore[arg-type]
    assert own.read_text() == kept + f"[gpu-11]:2222 ecdsa-sha2-nistp256 {listed.get_base64()}\n"
    assert known.judge("[gpu-11]:2222", listed)


def test_a_bracketed_alias_is_one_name(home: Path) -> None:
    # HostKeyAlias [GPU]:2222: every line is matched against `[gpu]:2222` only; ssh never
    # looks an alias up again without its port, as it does the `[addr]:port` it connected
    # to. A CA line or an @revoked line for `gpu` does not name it.
    from fleetclean.transport.hostkeys import Policy, key_name

    ca, key = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    (home / ".ssh" / "known_hosts").write_text(
        f"@cert-authority gpu ecdsa-sha2-nistp256 {ca.get_base64()}\n"
        f"@revoked gpu ecdsa-sha2-nistp256 {key.get_base64()}\n")
    known = KnownHostsCache(()).get(None)
    alias = key_name("10.0.0.7", 22, "[GPU]:2222")
    assert alias == "[gpu]:2222"
    assert not known.vouched(alias, aliased=True) and not known.marked(alias, aliased=True)
    assert known.vouched("[gpu]:2222") and known.marked("[gpu]:2222")  # an address: both
    assert not known.judge(alias, key, aliased=True)  # unknown: neither line names it
    Policy(known, accept_new=True, alias=alias).missing_host_key(
        None, "10.0.0.7", key)  # type: ignore[arg-type]
    assert (home / ".ssh" / "known_hosts").read_text().endswith(
        f"\n[gpu]:2222 ecdsa-sha2-nistp256 {key.get_base64()}\n")
