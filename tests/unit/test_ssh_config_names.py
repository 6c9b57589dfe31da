"""What ssh_config says for a login, by the names ssh uses: the inventory's user for
``Match user`` (as ``ssh -l``, with OpenSSH's ``ssh -G`` as the judge), a jump host's own
keys, and ``HostKeyAlias`` for the host key (``transport/upstream.py``, ``hops.py``,
``hostkeys.py``, ``inventory/ssh_settings.py``)."""

from __future__ import annotations

import getpass
import shutil
import subprocess
from pathlib import Path

import paramiko
import pytest
from simhelp import ssh_g

from fleetclean.inventory.ssh_settings import SshSettings, merge
from fleetclean.transport.base import TransportFailure
from fleetclean.transport.classify import Phase, Where, classify
from fleetclean.transport.hops import Target, parse_config, resolve
from fleetclean.transport.hostkeys import KnownHosts, UnknownHostKey, apply
from fleetclean.transport.pool import name_hop

MATCH_USER = (
    "Host gpu01\n  Port 2201\n"
    "Match user alice\n  HostName alice.example\n"
    "Host gpu02\n  User bob\n"
    "Match user bob\n  HostName bob.example\n"
    "Host *\n  User carol\n"
    "Match !user root,alice,bob\n  Port 2299\n"
)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh -G")
@pytest.mark.parametrize("user", [None, "alice", "bob", "dave", getpass.getuser()])
@pytest.mark.parametrize("name", ["gpu01", "gpu02", "gpu03"])
def test_match_user_is_judged_with_the_command_lines_user_as_ssh_judges_it(
    tmp_path: Path, name: str, user: str | None
) -> None:
    # ssh sets -l's user before it reads the config: every `Match user` is judged with it,
    # and the config's own `User` (before the block or after it) does not replace it.
    # Without one, the config's User so far, else the local user.
    config = tmp_path / "ssh_config"
    config.write_text(MATCH_USER)
    found = parse_config(MATCH_USER).lookup(name, user=user)
    ours = {"user": found.get("user", getpass.getuser()), "hostname": found["hostname"],
            "port": found.get("port", "22")}
    assert ours == ssh_g(config, name, user)


def test_the_inventorys_user_decides_its_match_user_blocks() -> None:
    cfg = parse_config("Host *\n  User svc\nMatch user ops\n  HostName 10.0.0.9\n"
                       "  IdentityFile /k/ops\n  HostKeyAlias Node9\n")

    def settings(user: str | None, options: dict[str, str]) -> SshSettings:
        return merge("gpu09", host=None, port=None, user=user, key=None, proxy_jump=None,
                     options=options, config=cfg)

    ops = settings("ops", {})
    assert (ops.address, ops.user, ops.key) == ("10.0.0.9", "ops", "/k/ops")
    assert ops.options["hostkeyalias"] == "Node9"
    other = settings(None, {})
    assert (other.address, other.user, other.key) == ("gpu09", "svc", None)
    # -o HostKeyAlias of the ssh arguments comes first, as on ssh's command line.
    assert settings("ops", {"hostkeyalias": "args"}).options["hostkeyalias"] == "args"


def test_a_jump_host_is_offered_its_own_keys_never_the_hosts() -> None:
    # ssh's `ssh -W` for a jump host gets -l, -p, -J and -F, not the host's -i or
    # -o IdentityFile (the inventory's key): the hop's IdentityFile, else ~/.ssh/id_*
    # (keys empty: paramiko's default files) and the agent.
    cfg = parse_config("Host b1\n  HostName 10.0.0.1\n  HostKeyAlias bastion.example\n"
                       "Host b2\n  IdentityFile /k/b2\n  IdentitiesOnly yes\n"
                       "Match user ops host b3\n  IdentityFile /k/ops\n"
                       "Host gpu*\n  IdentityFile /k/nodes\n")
    target = Target("gpu01", "10.1.0.1", 22, "ops", "/k/cluster", {"identitiesonly": "yes"},
                    ("/k/cluster", "/k/nodes"))
    b1, b2, b3, b3_ops = resolve(target, "b1,b2,b3,ops@b3:22", cfg).hops
    assert (b1.keys, b1.key, b1.agent) == ((), None, True)
    assert b1.options["hostkeyalias"] == "bastion.example"
    assert (b2.keys, b2.agent) == (("/k/b2",), False)
    # The hop's `Match user` is judged with its own user (the spec's), not the host's.
    assert (b3.keys, b3_ops.keys) == ((), ("/k/ops",))


def test_a_refused_jump_host_without_keys_of_its_own_says_what_it_is_offered() -> None:
    refused = TransportFailure("auth_failed", "authentication failed for root@10.0.0.1:22")
    bare = name_hop(refused, Target("jump", "10.0.0.1", 22, "root", None))
    assert bare.message.startswith("bastion jump (10.0.0.1:22): authentication failed")
    assert "its own IdentityFile (Host jump in ssh_config), else ~/.ssh/id_*" in bare.message
    own = name_hop(refused, Target("jump", "10.0.0.1", 22, "root", "/k/jump"))
    assert "IdentityFile" not in own.message


def test_a_jump_host_with_no_key_is_told_only_what_a_jump_host_is_offered(
        tmp_path: Path) -> None:
    # It named the inventory's key (ansible_ssh_private_key_file), never offered a jump
    # host; an encrypted key with no agent said only "Private key file is encrypted".
    none = classify(paramiko.SSHException("No authentication methods available"),
                    Where("10.0.0.1", 22, "root", None), Phase.AUTH, 0.1, 3.0)
    assert none is not None
    assert "ansible_ssh_private_key_file" in none.message  # a node: the inventory's key too
    hop = name_hop(none, Target("jump", "10.0.0.1", 22, "root", None))
    assert hop.message == (
        "bastion jump (10.0.0.1:22): no key to offer root@10.0.0.1:22: a jump host is "
        "offered its own IdentityFile (Host jump in ssh_config), else ~/.ssh/id_*, and the "
        "agent's keys (IdentityAgent, else $SSH_AUTH_SOCK), never the inventory's key: none "
        "is there")
    key = tmp_path / "cluster_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)],
                   check=True)
    locked = classify(paramiko.PasswordRequiredException("Private key file is encrypted"),
                      Where("10.0.0.2", 22, "root", str(key)), Phase.AUTH, 0.1, 3.0)
    assert locked is not None and locked.kind == "auth_failed"
    assert locked.message == (
        f"authentication failed for root@10.0.0.2:22 with key {key}: private key {key} is "
        f"encrypted: add it to your agent (ssh-add {key}); fleetclean asks for no "
        "passphrase")


def _key(seed: int) -> paramiko.PKey:
    return paramiko.Ed25519Key(data=bytes.fromhex(
        "0000000b7373682d65643235353139" "00000020" + f"{seed:02x}" * 32))


def test_a_host_key_is_looked_up_judged_and_recorded_by_its_alias(tmp_path: Path) -> None:
    # paramiko names the key [10.0.0.7]:2222; ssh names it by the HostKeyAlias, lower
    # case and without a port.
    key, other = _key(1), _key(2)
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu-tunnel-7 {key.get_name()} {key.get_base64()}\n")
    known = KnownHosts((str(path),))
    client = paramiko.SSHClient()
    apply(client, known, accept_new=False, alias="GPU-Tunnel-7")
    stored = client._host_keys.get("[10.0.0.7]:2222")  # type: ignore[attr-defined]
    assert stored is not None and stored[key.get_name()] == key
    policy = client._policy  # type: ignore[attr-defined]
    policy.missing_host_key(client, "[10.0.0.7]:2222", key)  # known: taken
    with pytest.raises(paramiko.BadHostKeyException):
        policy.missing_host_key(client, "[10.0.0.7]:2222", other)

    empty = tmp_path / "empty"
    empty.write_text("")
    fresh = KnownHosts((str(empty),))
    apply(client, fresh, accept_new=False, alias="GPU-Tunnel-7")
    with pytest.raises(UnknownHostKey) as raised:
        client._policy.missing_host_key(client, "[10.0.0.7]:2222", key)  # type: ignore[attr-defined]
    failure = classify(raised.value, Where("10.0.0.7", 2222, alias="gpu-tunnel-7"),
                       Phase.KEX, 0.1, 10)
    assert failure is not None and failure.message.startswith(
        "unknown host key for gpu-tunnel-7 (HostKeyAlias of 10.0.0.7:2222) (ssh-ed25519 ")
    apply(client, fresh, accept_new=True, alias="GPU-Tunnel-7")
    client._policy.missing_host_key(client, "[10.0.0.7]:2222", key)  # type: ignore[attr-defined]
    assert empty.read_text() == f"gpu-tunnel-7 {key.get_name()} {key.get_base64()}\n"
