"""Non-root logins over real SSH against the simulated nodes' real sudo (Debian's).

Accounts on every node (``fleetclean/sim/accounts.py``): ``ops`` (NOPASSWD), ``alice``
(sudo asks her password), ``bob`` (no sudo rights); node02 has ``Defaults requiretty``.
With become, the script must run as root, the password must travel only to sudo, and each
refusal must be one line with nothing run. Without become, a login does what its rights
allow: its own processes go, everyone else's are named and the host is dirty.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from simhelp import Cli, alive

from fleetclean.sim import SimFleet, accounts

pytestmark = pytest.mark.sim

FAST = ("-e", "grace=1", "-e", "verify_timeout=2", "--json")


@pytest.fixture(scope="module")
def fleet(module_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    if not accounts.has_sudo():
        pytest.fail("sudo is not installed on this machine: run scripts/dev setup")
    fleet = module_fleet_factory(2)
    fleet.set_fault("node02", "requiretty")
    return fleet


@pytest.fixture(autouse=True)
def _empty_nodes(fleet: SimFleet) -> Iterator[None]:
    """Every test starts from idle nodes: what one leaves behind is killed, by node PID."""
    yield
    for node in fleet.nodes:
        left = [str(p.pid) for p in fleet.processes(node)]
        if left:
            fleet.run_in(node, ["kill", "-9", *left])


def inventory(fleet: SimFleet, path: Path, user: str, mode: int = 0o600,
              **more: Any) -> Path:
    """The simulator's inventory with every host logging in as ``user``."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    for host in data["all"]["hosts"].values():
        host.update(ansible_user=user, **more)
    path.write_text(yaml.safe_dump(data))
    path.chmod(mode)
    return path


def roots_job(fleet: SimFleet, node: str = "node01") -> list[int]:
    return fleet.spawn(node, "sglang", gpus="0-1")


def assert_untouched(fleet: SimFleet, node: str, pids: list[int], res: Any) -> None:
    assert alive(fleet, node, pids) == pids
    assert res.host(node)["signalled"] == [] and res.host(node)["stages"] == []


# ---- become: NOPASSWD, -K through a terminal, the inventory's password ------------------


def test_nopasswd_login_becomes_root_and_stops_roots_server(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    job = roots_job(fleet)
    inv = inventory(fleet, tmp_path / "ops.yml", "ops", ansible_become=True)

    res = cli("run", "post-extraction", "-i", inv, "-l", "node01", *FAST)

    assert res.code == 0, res.err + res.out
    assert res.host("node01")["status"] == "clean"
    assert alive(fleet, "node01", job) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8


def test_become_password_from_inventory_and_a_warning_when_others_can_read_it(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    password = fleet.sudo_password
    job = roots_job(fleet)
    private = inventory(fleet, tmp_path / "alice.yml", "alice", ansible_become=True,
                        ansible_become_password=password)
    res = cli("run", "post-extraction", "-i", private, "-l", "node01", *FAST)
    assert res.code == 0, res.err + res.out
    assert alive(fleet, "node01", job) == []
    assert "warning" not in res.err

    shared = inventory(fleet, tmp_path / "shared.yml", "alice", 0o644, ansible_become=True,
                       ansible_become_pass=password)  # Ansible's older spelling
    res = cli("status", "-i", shared, "-l", "node01", "--json")
    assert res.code == 0, res.err
    assert res.err == (f"fleetclean: warning: {shared} holds ansible_become_password and is "
                       f"readable by others than its owner (mode 0644); chmod 600 {shared}\n")
    for text in (res.out, res.err, *records(tmp_path)):
        assert password not in text


def records(tmp_path: Path) -> list[str]:
    """Every run record the ``cli`` fixture's runs left (its state dir is the test's)."""
    return [p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file()]


def run_in_pty(argv: list[str], env: dict[str, str], answer: str,
               sample: Callable[[int], None]) -> tuple[int, str]:
    """The real CLI on a pseudo-terminal: ``answer`` typed at the prompt, ``sample(pid)``
    called every few milliseconds while it runs. Returns (exit status, all it printed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes the CLI at once
        os.execve(sys.executable, [sys.executable, "-m", "fleetclean", *argv], env)
    seen, typed, status = b"", False, None
    try:
        while status is None:
            if select.select([fd], [], [], 0.01)[0]:
                with contextlib.suppress(OSError):  # EIO: the terminal's other side closed
                    seen += os.read(fd, 65536)
            if not typed and b"BECOME password: " in seen:
                os.write(fd, answer.encode() + b"\n")
                typed = True
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(code)
            else:
                sample(pid)
        while select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(fd)
    return status, seen.decode(errors="replace")


def process_texts(host_pids: list[int]) -> list[str]:
    """Command lines and environments of these (host) PIDs, as `ps e` would show them."""
    out = []
    for pid in host_pids:
        for name in ("cmdline", "environ"):
            try:
                out.append(Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def test_ask_become_pass_on_a_terminal_and_the_password_is_never_anywhere(
    fleet: SimFleet, tmp_path: Path
) -> None:
    """-K: asked once on the terminal, fed to sudo; while the run goes on, no process on the
    controller or in the node has it in its argv or environment, and no output, record or
    log has it afterwards."""
    password = fleet.sudo_password
    job = fleet.spawn("node01", "slow", gpu=2, delay=1.5)  # the run lasts a while
    inv = inventory(fleet, tmp_path / "alice.yml", "alice")
    state = tmp_path / "state"
    env = dict(os.environ, FLEETCLEAN_STATE_DIR=str(state), NO_COLOR="1")
    leaks: list[str] = []
    node_saw: set[str] = set()

    def sample(cli_pid: int) -> None:
        node = fleet.processes("node01")
        node_saw.update(p.cmdline.split()[0] for p in node if p.cmdline)
        for text in process_texts(descendants(cli_pid) + [p.host_pid for p in node]):
            if password in text:
                leaks.append(text)

    code, printed = run_in_pty(["run", "post-extraction", "-i", str(inv), "-l", "node01",
                                "-b", "-K", *FAST], env, password, sample)

    assert code == 0, printed
    assert printed.count("BECOME password: ") == 1
    result = json.loads(printed[printed.index("{"):])
    assert result["hosts"][0]["status"] == "clean"
    assert alive(fleet, "node01", job) == []
    assert "sudo" in node_saw, "sampled while sudo ran in the node"
    assert leaks == []
    for text in (printed, *records(tmp_path), (fleet.node("node01").dir / "sshd.log").read_text()):
        assert password not in text


def test_ask_become_pass_without_a_terminal_is_bad_input(fleet: SimFleet, tmp_path: Path) -> None:
    inv = inventory(fleet, tmp_path / "alice.yml", "alice")
    done = subprocess.run([sys.executable, "-m", "fleetclean", "status", "-i", str(inv), "-b",
                           "-K"], capture_output=True, text=True, start_new_session=True,
                          input="hunter2\n", timeout=60, check=False)
    assert done.returncode == 4
    assert done.stderr == ("fleetclean: error: -K/--ask-become-pass needs a terminal to ask on, "
                           "and there is none (run it from a terminal, or set "
                           "ansible_become_password in an inventory only you can read)\n")


# ---- become refused: one line, nothing run ---------------------------------------------


@dataclass(frozen=True)
class Refusal:
    id: str
    user: str
    node: str
    status: str
    words: str
    more: dict[str, str] = field(default_factory=dict)


REFUSALS = [
    Refusal("wrong-password", "alice", "node01", "auth_failed",
            "sudo on node01 refused the become password for alice; check the password given "
            "with -K/--ask-become-pass or ansible_become_password",
            {"ansible_become_password": "not-her-password"}),
    Refusal("no-password-given", "alice", "node01", "auth_failed",
            "sudo on node01 asks alice for a password (before it checks what alice may run) "
            "and none was given; rerun with -K (--ask-become-pass), set "
            "ansible_become_password, or give alice NOPASSWD in sudoers"),
    Refusal("no-sudo-rights", "bob", "node01", "error",
            "bob may not run commands as root with sudo on node01 (bob is not in the sudoers "
            "file.); ask its admin for a sudoers rule, or run without become: fleetclean then "
            "signals only bob's own processes", {"ansible_become_password": "{password}"}),
    Refusal("requiretty", "ops", "node02", "error",
            "sudo on node02 requires a terminal (Defaults requiretty) and fleetclean never runs "
            "the script in one; ask its admin for 'Defaults:ops !requiretty', or log in as "
            "root without become"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[r.id for r in REFUSALS])
def test_sudo_refusals_are_one_line_and_nothing_runs(
    fleet: SimFleet, cli: Cli, tmp_path: Path, case: Refusal
) -> None:
    job = roots_job(fleet, case.node)
    more = {k: v.replace("{password}", fleet.sudo_password) for k, v in case.more.items()}
    inv = inventory(fleet, tmp_path / "inv.yml", case.user, ansible_become=True, **more)

    # Within the connect timeout: past it, the dialogue would be a timeout.
    res = cli("run", "post-extraction", "-i", inv, "-l", case.node, "--connect-timeout", "6",
              *FAST)

    assert res.code == 2
    host = res.host(case.node)
    assert (host["status"], host["error"]) == (case.status, case.words)
    assert_untouched(fleet, case.node, job, res)
    assert fleet.sudo_password not in res.out + res.err


# ---- without become: what the login's rights allow -------------------------------------


def test_status_as_a_plain_user_sees_every_users_gpu_memory_and_holders(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    roots = fleet.spawn("node01", "stubborn", gpu=0, mib=62000)
    bobs = fleet.spawn("node01", "stubborn", gpu=5, mib=4096, user="bob")
    own = fleet.spawn("node01", "stubborn", gpu=7, mib=1024, user="ops")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    res = cli("status", "-i", inv, "-l", "node01", "--json")

    host = res.host("node01")
    assert host["status"] == "dirty"
    used = [g["memory_used_mib"] for g in host["gpus"]]
    assert used == [62000, 0, 0, 0, 0, 4096, 0, 1024] == fleet.gpu_used_mib("node01")
    # Root's and bob's holders too, with their users: nvidia-smi's compute apps name every
    # user's processes, though ops can read only its own processes' /proc/PID/fd.
    assert host["error"].endswith(
        f"held by {roots[0]} python3 stubborn_worker.py --gpu 0 (root; GPU0), "
        f"{bobs[0]} python3 stubborn_worker.py --gpu 5 (bob; GPU5), "
        f"{own[0]} python3 stubborn_worker.py --gpu 7 (ops; GPU7)")


def test_plain_user_teardown_of_its_own_gpu_job_is_clean(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    job = fleet.spawn("node01", "sglang", gpus="0-3", user="ops")
    stubborn = fleet.spawn("node01", "stubborn", gpu=6, user="ops")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    res = cli("run", "post-extraction", "-i", inv, "-l", "node01", *FAST)

    assert res.code == 0, res.err + res.out
    assert res.host("node01")["status"] == "clean"
    assert alive(fleet, "node01", job + stubborn) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8


def test_plain_user_teardown_of_roots_job_names_each_process_and_is_dirty(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    server, tp0, tp1, detok = roots_job(fleet)
    own = fleet.spawn("node01", "stubborn", gpu=4, user="ops")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    res = cli("run", "post-extraction", "-i", inv, "-l", "node01", *FAST)

    assert res.code == 1, res.err + res.out
    host = res.host("node01")
    assert host["status"] == "dirty"
    assert host["error"].startswith(
        f"stop-server: not permitted: {server} python3 -m sglang.launch_server ")
    for pid, name in ((tp0, "sglang::scheduler_TP0"), (tp1, "sglang::scheduler_TP1"),
                      (detok, "sglang::detokenizer")):
        assert f"{pid} {name} (root)" in host["error"]
    assert alive(fleet, "node01", [server, tp0, tp1, detok]) == [server, tp0, tp1, detok]
    assert alive(fleet, "node01", own) == [], "its own holder is still stopped"
    assert {s["status"] for s in host["stages"] if s["name"] != "guard-writers"} >= {"denied"}
    assert {s["pid"] for s in host["signalled"]} == set(own)


def test_plain_users_lock_excludes_its_other_runs(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    """The per-host lock of a login without root: its own 0700 directory, which its next
    run finds held."""
    lock = "/tmp/fleetclean-lock-2601/lock"
    fleet.run_in("node01", ["sh", "-c", f"mkdir -p -m 700 {lock.rsplit('/', 1)[0]}; "
                            f"flock {lock} sleep 30 >/dev/null 2>&1 &"], user="ops")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    res = cli("run", "pre-restart", "-i", inv, "-l", "node01", "-e", "lock_wait=0.3", "--json")

    assert res.host("node01")["status"] == "error"
    assert res.host("node01")["error"] == f"host busy: another fleetclean run holds {lock}"


def test_plain_users_device_file_fallback_sees_only_its_own_fds(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    """Without nvidia-smi, gpu-holders falls back to /proc/PID/fd, where a user sees only
    its own processes (as on a real node): root's holder is not even matched."""
    roots = fleet.spawn("node01", "stubborn", gpu=3)
    own = fleet.spawn("node01", "stubborn", gpu=4, user="ops")
    book = tmp_path / "free.yaml"
    book.write_text("name: free\ndescription: every GPU holder\nstages:\n"
                    "  - {name: free, type: gpu-holders, grace: 1}\n")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")
    fleet.set_fault("node01", "missing")
    try:
        res = cli("run", book, "-i", inv, "-l", "node01", "--json")
    finally:
        fleet.set_fault("node01", "none")

    stage = res.host("node01")["stages"][0]
    assert (stage["matched"], stage["signalled"]) == (1, 2), "TERM, then KILL: stubborn"
    assert {s["pid"] for s in res.host("node01")["signalled"]} == set(own)
    assert alive(fleet, "node01", roots + own) == roots


def test_a_target_it_may_not_signal_is_never_a_silent_success(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    """Root's server holds no GPU: the GPUs verify clean, yet the host is dirty, because
    the teardown could not stop what it was asked to stop."""
    (server,) = fleet.spawn("node01", "monitor", name="python3 -m sglang.launch_server --tp 1")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    res = cli("run", "pre-restart", "-i", inv, "-l", "node01", *FAST)

    host = res.host("node01")
    assert (res.code, host["status"]) == (1, "dirty")
    assert host["error"] == (
        f"stop-server: not permitted: {server} python3 -m sglang.launch_server --tp 1 (root)")
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0] * 8
    assert alive(fleet, "node01", [server]) == [server]


def test_a_plain_users_check_lists_what_its_run_would_be_refused(
    fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    """--check without root says of root's processes what the run would find: not
    permitted, never "would send TERM"; its own holder it would signal."""
    server, tp0, tp1, detok = roots_job(fleet)
    own = fleet.spawn("node01", "stubborn", gpu=4, user="ops")
    inv = inventory(fleet, tmp_path / "ops.yml", "ops")

    check = cli("run", "post-extraction", "-i", inv, "-l", "node01", "--check", "--json")
    told = cli("run", "post-extraction", "-i", inv, "-l", "node01", "--check")

    host = check.host("node01")
    assert host["status"] == "dirty"
    assert host["error"].startswith(
        f"stop-server: not permitted: {server} python3 -m sglang.launch_server ")
    assert "denied" in {s["status"] for s in host["stages"]}
    assert f"would send TERM to {own[0]} (" in told.out, told.out
    for pid in (server, tp0, tp1, detok):
        assert f"{pid} " in host["error"] and f" to {pid} (" not in told.out, told.out
    # A check signals nothing.
    assert alive(fleet, "node01", [server, tp0, tp1, detok, *own]) == [
        server, tp0, tp1, detok, *own]

    # And the run finds what the check said.
    res = cli("run", "post-extraction", "-i", inv, "-l", "node01", *FAST)
    assert res.host("node01")["error"].startswith(host["error"].split(";")[0][:60])
    assert alive(fleet, "node01", own) == []
