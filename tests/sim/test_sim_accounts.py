"""The simulated nodes' own accounts and sudo, and what a non-root account sees of the GPUs.

The accounts, their homes and the sudo configuration are the node's (bind mounts in its
mount namespace): this machine's stay as they were. As on a real node, a user cannot read
another user's /proc/PID/fd, yet nvidia-smi tells every user every process's GPU memory.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
HOST_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/sudoers", "/etc/hosts",
              "/etc/nsswitch.conf")
APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def test_accounts_and_sudo_are_the_nodes_own_and_this_machines_stay_untouched(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    before = {p: Path(p).read_bytes() for p in HOST_FILES}
    sudoers_d = sorted(p.name for p in Path("/etc/sudoers.d").iterdir())
    fleet = sim_fleet_factory(1)

    ops = fleet.run_in("node01", ["id", "-nG"], user="ops")
    alice = fleet.run_in("node01", ["id", "-nG"], user="alice")
    sudo = fleet.run_in("node01", ["sudo", "-n", "-u", "root", "--", "id", "-un"], user="ops")
    key = fleet.run_in("node01", ["stat", "-c", "%U %a", "/home/bob", "/home/bob/.ssh",
                                  "/home/bob/.ssh/authorized_keys"])

    assert (ops.stdout, alice.stdout) == ("ops\n", "alice sudo\n")
    assert sudo.stdout == "root\n", sudo.stderr
    assert key.stdout.split("\n")[:3] == ["bob 700", "bob 700", "bob 600"]
    assert {p: Path(p).read_bytes() for p in HOST_FILES} == before
    assert sorted(p.name for p in Path("/etc/sudoers.d").iterdir()) == sudoers_d
    assert not Path("/home/ops").exists()
    login = subprocess.run(
        ["ssh", "-F", str(fleet.ssh_config_path), "-l", "bob", "node01", "id -un"],
        capture_output=True, text=True, timeout=30, check=False)
    assert login.stdout == "bob\n", login.stderr


def test_nvidia_smi_tells_every_user_every_processs_memory(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    fleet = sim_fleet_factory(1)
    roots = fleet.spawn("node01", "stubborn", gpu=1, mib=8192)
    bobs = fleet.spawn("node01", "stubborn", gpu=5, mib=4096, user="bob")
    want = sorted([f"{roots[0]}, 8192", f"{bobs[0]}, 4096"])

    for user in ("root", "ops", "bob"):
        apps = fleet.run_in("node01", APPS, user=user)
        assert sorted(apps.stdout.splitlines()) == want, (user, apps.stderr)
    fds = fleet.run_in("node01", ["ls", f"/proc/{roots[0]}/fd"], user="ops")
    assert fds.returncode != 0 and "Permission denied" in fds.stderr
    assert fleet.run_in("node01", ["ls", f"/proc/{bobs[0]}/fd"], user="bob").returncode == 0
    # With nobody answering for the driver, a user's nvidia-smi fails as with no driver.
    sock = "/run/fleetclean-gpu-driver.sock"
    fleet.run_in("node01", ["mv", sock, sock + ".away"])
    try:
        down = fleet.run_in("node01", APPS, user="ops")
    finally:
        fleet.run_in("node01", ["mv", sock + ".away", sock])
    assert down.returncode == 9
    assert down.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    assert fleet.run_in("node01", APPS, user="root").returncode == 0, "root reads /proc itself"
