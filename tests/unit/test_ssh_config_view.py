"""An ssh_config lookup that sees only the blocks that can apply finds what paramiko's full
walk finds: the same settings, in the same order of precedence."""

from __future__ import annotations

import paramiko
import pytest

from fleetclean.transport.upstream import SSHConfig

CONFIG = """\
Host gpu01
    HostName 10.0.0.1
    User alice
Host gpu0?
    Port 2222
    User bob
Host gpu02 gpu03
    HostName 10.0.0.23
Host !gpu03 gpu*
    IdentityFile ~/.ssh/gpu
Match host gpu03
    User carol
Host gpu01
    Port 2200
Host *
    User root
    Port 22
    ServerAliveInterval 5
"""


@pytest.mark.parametrize("name", ["gpu01", "gpu02", "gpu03", "gpu10", "login"])
def test_the_view_finds_what_the_whole_file_says(name: str) -> None:
    full = paramiko.SSHConfig.from_text(CONFIG).lookup(name)
    seen = SSHConfig.from_text(CONFIG).lookup(name)
    assert dict(seen) == dict(full)


def test_a_generated_config_with_a_block_per_node_gives_each_its_own_address() -> None:
    text = "".join(f"Host node{i:04d}\n    HostName 127.0.{i // 250}.{i % 250}\n"
                   for i in range(1000))
    config = SSHConfig.from_text(text + "Host *\n    User root\n")
    assert config.lookup("node0517")["hostname"] == "127.0.2.17"
    assert config.lookup("node0517")["user"] == "root"
    assert config.lookup("node1000")["hostname"] == "node1000"  # no block of its own
