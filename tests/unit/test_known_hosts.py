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
