"""SSH keys and the files a client needs to reach a simulated fleet.

One ed25519 client key per fleet, one ed25519 host key per node, an sshd_config per node,
and for clients: ``known_hosts`` (plain entries: the node name and its address),
``ssh_config`` (``ssh -F ssh_config node01``) and an Ansible YAML inventory, which is what
``fleetclean -i`` reads.

A fleet with a host CA (``SimFleet.up(host_ca=True)``, ``sim up --host-ca``) is a site with
an SSH certificate authority: each node's host key is signed by the fleet's CA key
(``ssh-keygen -s CA -h``, the node's name and address its principals), its sshd shows that
``HostCertificate``, and ``known_hosts`` holds one ``@cert-authority`` line instead of
every node's key.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from fleetclean.errors import SimError


class NodeLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def dir(self) -> Path: ...


HOST_KEY = "ssh_host_ed25519_key"
HOST_CERT = HOST_KEY + "-cert.pub"  # where ssh-keygen -s writes the key's certificate
# Where sshd listens when a slow/stalling proxy (sshproxy.py) holds port 22.
INNER_PORT = 2222
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games:/usr/local/sbin"


def keygen(path: Path, comment: str) -> None:
    """A fresh ed25519 key pair at ``path`` (OpenSSH's private key format, mode 0600) and
    ``path.pub``, replacing any old one; what ``ssh-keygen -t ed25519 -N ''`` writes.

    Made in this process (``cryptography``, which paramiko already needs): one ssh-keygen
    per node cost a 1,000-node ``up`` about 20 s of CPU."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    pub = path.with_name(path.name + ".pub")
    for old in (path, pub):
        old.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        pub.write_text(f"{public.decode()} {comment}\n")
    except OSError as exc:
        raise SimError(f"cannot write the key {path}: {exc}") from exc


def public_key(path: Path) -> str:
    """``ssh-ed25519 AAAA...`` without the comment."""
    key_type, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{key_type} {blob}"


# OpenSSH's own limits are MaxStartups 10:30:100 (unauthenticated connections: past 10,
# new ones are dropped before the banner with a rising probability, all past 100) and
# MaxSessions 10 (shell/exec/subsystem channels per connection; a direct-tcpip channel
# through a jump host is not one). The simulator lifts them so that a test of many hosts
# measures fleetclean, not sshd's throttling, except on nodes that ask for OpenSSH's own
# (``SimFleet.up(sshd_defaults=True)``) or for others (``SimFleet.set_sshd_limits``).
LIFTED = ("512", 512)


def sshd_config(address: str, in_node_dir: str, port: int = 22, *,
                max_startups: str | None = LIFTED[0],
                max_sessions: int | None = LIFTED[1], certificate: bool = False) -> str:
    """sshd_config for one node; paths are as seen inside the node; a limit of None is
    left to OpenSSH's default; ``certificate``: sshd shows its host key's certificate
    (``HOST_CERT``) too. The login accounts (``sim/accounts.py``) use
    ``~/.ssh/authorized_keys`` in their node-private homes under sshd's default
    StrictModes; root's keys stay in the node's state dir.

    >>> "MaxStartups" in sshd_config("127.0.1.1", "/run/fleetclean", max_startups=None)
    False
    """
    limits = "".join(f"{word} {value}\n" for word, value in (
        ("MaxStartups", max_startups), ("MaxSessions", max_sessions)) if value is not None)
    cert = f"HostCertificate {in_node_dir}/{HOST_CERT}\n" if certificate else ""
    return f"""\
# Written by fleetclean.sim for one simulated node.
ListenAddress {address}:{port}
HostKey {in_node_dir}/{HOST_KEY}
{cert}PidFile none
AuthorizedKeysFile .ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
UseDNS no
PrintMotd no
PrintLastLog no
{limits}LogLevel VERBOSE
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
Match User root
    AuthorizedKeysFile {in_node_dir}/authorized_keys
Match User *,!root
    # A user's default PATH, plus where the node keeps nvidia-smi (/usr/bin on a real node).
    SetEnv PATH={USER_PATH}
"""


def write_known_hosts(path: Path, nodes: Sequence[NodeLike]) -> None:
    lines = [f"{node.name},{node.address} {public_key(node.dir / HOST_KEY)}\n" for node in nodes]
    path.write_text("".join(lines))


def write_cert_authority(path: Path, ca: Path, patterns: str) -> None:
    """known_hosts for a fleet whose host keys ``ca`` signs: one ``@cert-authority`` line
    for the hosts ``patterns`` match, no node's own key."""
    path.write_text(f"@cert-authority {patterns} {public_key(ca)}\n")


def sign_host_key(ca: Path, node_dir: Path, identity: str, principals: Sequence[str],
                  validity: str | None = None) -> Path:
    """The node's host key signed by the CA key ``ca`` as a host certificate, with real
    ``ssh-keygen -s`` (``-n`` the principals, none where empty; ``-V`` the validity as
    ssh-keygen takes it, e.g. ``-1d:+1d``, ``20200101:20200102``; default forever):
    ``HOST_CERT`` in ``node_dir``, replacing any old one."""
    key = node_dir / f"{HOST_KEY}.pub"
    cmd = ["ssh-keygen", "-q", "-s", str(ca), "-I", identity, "-h"]
    if principals:
        cmd += ["-n", ",".join(principals)]
    if validity is not None:
        cmd += ["-V", validity]
    try:
        done = subprocess.run([*cmd, str(key)], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SimError(f"cannot run ssh-keygen: {exc}",
                       hint="install it: apt-get install openssh-client") from exc
    if done.returncode != 0:
        raise SimError(f"ssh-keygen could not sign {key}: {done.stderr.strip()}")
    return node_dir / HOST_CERT


def write_ssh_config(path: Path, nodes: Sequence[NodeLike], key: Path, known: Path) -> None:
    blocks = [
        f"Host {node.name}\n"
        f"    HostName {node.address}\n"
        "    Port 22\n"
        "    User root\n"
        f"    IdentityFile {key}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known}\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
        "    LogLevel ERROR\n"
        for node in nodes
    ]
    path.write_text("\n".join(blocks))


def write_inventory(path: Path, nodes: Sequence[NodeLike], key: Path, known: Path) -> None:
    hosts = {
        node.name: {
            "ansible_host": node.address,
            "ansible_port": 22,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
        }
        for node in nodes
    }
    doc = {
        "all": {
            "hosts": hosts,
            "vars": {
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
                )
            },
            "children": {"sim": {"hosts": {node.name: None for node in nodes}}},
        }
    }
    header = "# Simulated fleet written by fleetclean.sim; stop it with `fleetclean sim down`.\n"
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
