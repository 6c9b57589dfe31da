"""Helpers shared by the tests that drive the CLI against the simulated fleet.

``tests/`` is on ``sys.path`` (pytest puts the directory of ``tests/conftest.py`` there), so
any test imports them with ``from simhelp import ...``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetclean.engine.render import UVM_REFCNT
from fleetclean.sim import SimFleet, uvm_count
from fleetclean.transport.boot import BASH, read_and_run


@dataclass
class CliResult:
    code: int
    out: str
    err: str
    seconds: float = 0.0

    def json(self) -> Any:
        return json.loads(self.out)

    def host(self, name: str) -> dict[str, Any]:
        hosts: list[dict[str, Any]] = self.json()["hosts"]
        return next(h for h in hosts if h["host"] == name)


Cli = Callable[..., CliResult]


def listening(address: str) -> bool:
    """True when something listens on address:22 (read from /proc: no probe connection)."""
    want = "{:08X}:0016".format(int.from_bytes(bytes(map(int, address.split("."))), "little"))
    with open("/proc/net/tcp") as f:
        return any(line.split()[1] == want for line in list(f)[1:])


# A subnet a test process picked is claimed with an flock on a file named after it, held
# until its fleet is down, so that two pytest workers (or two runs on one machine) never
# pick the same one: seeing nobody listen on it is not enough, as the other may be between
# its own check and its sshd's bind ("Address already in use"). The kernel drops a dead
# process's locks, so a crashed run never leaves a subnet taken. The directory is one fixed
# path (not $TMPDIR's, which two runs may set apart), ours alone, its files opened without
# following a link.
CLAIMS = Path("/tmp/fleetclean-test-subnets")
_held: dict[int, int] = {}


def _claims_dir() -> Path:
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    st = CLAIMS.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise RuntimeError(f"{CLAIMS} is not a directory of ours: remove it")
    return CLAIMS


def claim_subnet(first: int, count: int, seed: int) -> int:
    """A second octet in first..first+count-1 that no other process has claimed and whose
    127.S.1.1:22 nobody listens on, claimed until ``release_subnet``."""
    where = _claims_dir()
    for i in range(count):
        subnet = first + (seed + i) % count
        if subnet in _held:
            continue
        fd = os.open(where / f"{subnet}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if listening(f"127.{subnet}.1.1"):
            os.close(fd)
            continue
        _held[subnet] = fd
        return subnet
    raise RuntimeError(f"no free 127.S.0.0/16 subnet in {first}..{first + count - 1}")


def release_subnet(subnet: int) -> None:
    fd = _held.pop(subnet, None)
    if fd is not None:
        os.close(fd)


def up_claimed(subnet: int, nodes: int, state_dir: Path, **opts: Any) -> SimFleet:
    """``SimFleet.up`` on a subnet this process claimed, its claim released where the start
    fails (``down_checked`` releases it once the fleet is down)."""
    try:
        return SimFleet.up(nodes, state_dir, subnet=subnet, **opts)
    except BaseException:
        release_subnet(subnet)
        raise


def fleet_subnet(fleet: SimFleet) -> int:
    return int(fleet.nodes[0].address.split(".")[1])


def module_subnet() -> int:
    """A free 127.S.0.0/16 for a module-scoped fleet, in 20..89 (tests/conftest.py's
    per-test fleets use 100..249, so the two never meet); ``down_checked`` releases it."""
    return claim_subnet(20, 70, os.getpid() * 11)


def ssh_log_count(fleet: SimFleet, needle: str = "Connection from") -> int:
    """How many lines of every node's sshd log contain ``needle``: each TCP connection
    sshd accepts logs one "Connection from" line (LogLevel VERBOSE)."""
    total = 0
    for node in fleet.nodes:
        try:
            text = (node.dir / "sshd.log").read_text(errors="replace")
        except OSError:
            continue
        total += sum(needle in line for line in text.splitlines())
    return total


def edit_inventory(fleet: SimFleet, dest: Path, *, group_vars: dict[str, Any] | None = None,
                   **host_vars: dict[str, Any]) -> Path:
    """A copy of the simulator's inventory with some host (or all-group) variables set."""
    data = yaml.safe_load(fleet.inventory_path.read_text())
    for host, changes in host_vars.items():
        data["all"]["hosts"][host].update(changes)
    if group_vars:
        data["all"]["vars"].update(group_vars)
    dest.write_text(yaml.safe_dump(data))
    return dest


def spawn_holder(fleet: SimFleet, node: str, uid: int, gid: int, *, gpu: int, mib: int,
                 name: str, cuda: bool = True, env: dict[str, str] | None = None,
                 cgroups: Sequence[str] = ()) -> int:
    """A holder of GPU ``gpu`` (nvidia-smi's index) run by ``uid``/``gid`` (no account
    needed) and called ``name``, detached (setsid -f), once it holds the GPU: its file and
    /dev/nvidia-uvm, as a CUDA process has them open (``cuda=False``: the GPU's file
    alone, as an NVML user holds it); ``env``: more of its environment; ``cgroups``: the
    node's cgroup directories it starts in (a unit's, in each hierarchy), as a process that
    unit forked would be."""
    gpus = json.loads((fleet.node(node).dir / "gpus.json").read_text())["gpus"]
    # Counted in the node's nvidia_uvm refcnt once it is open, as sim/programs.py's are.
    uvm = f" u = open('/dev/nvidia-uvm'); {uvm_count.OPENED_PY};" if cuda else ""
    code = f"import time; f = open('/dev/nvidia{gpus[gpu]['minor']}');{uvm} time.sleep(3600)"
    # Its streams away from ours, or run_in would wait for it to end.
    detach = 'setsid -f "$@" </dev/null >/dev/null 2>&1'
    for directory in cgroups:
        detach = f"echo $$ > {directory}/cgroup.procs && {detach}"
    done = fleet.run_in(node, ["sh", "-c", detach, "sh", "setpriv", f"--reuid={uid}",
                               f"--regid={gid}", "--clear-groups", "env",
                               *(f"{k}={v}" for k, v in (env or {}).items()),
                               f"FLEETCLEAN_SIM_GPU_MIB={mib}", "python3", "-c", code, name])
    assert done.returncode == 0, done.stderr
    for _ in range(300):
        found = [p.pid for p in fleet.processes(node) if p.cmdline.endswith(f" {name}")]
        if found and fleet.gpu_used_mib(node)[gpu] >= mib:
            return found[0]
        fleet.run_in(node, ["sleep", "0.05"])
    raise AssertionError(f"{name} did not start")


# How transport.boot's command reads the script, up to its size (a status's starts its GPU
# read first: transport.boot.first_read).
_BOOT_READ = read_and_run(0).partition(" 0 ")[0] + " "


def is_script(cmdline: str) -> bool:
    """Whether a node's process is a fleetclean script's bash: started over SSH by
    ``transport.boot``'s command (``bash --norc -p -c '... unset FC_SRC; read ...'``),
    locally or through sudo as ``bash --norc -p -s``."""
    return cmdline == f"{BASH} -s" or (cmdline.startswith(f"{BASH} -c ")
                                      and _BOOT_READ in cmdline)


def alive(fleet: SimFleet, node: str, pids: list[int]) -> list[int]:
    """The PIDs of ``pids`` still running in ``node`` (its own daemons included). A process
    in its exit, its memory already released (empty command line: it runs no more code of
    its own and cannot come back), is dead, as fleetclean counts it: under load an exit
    can outlast the run that caused it (seen at a load average of 80 in
    test_nvidia_smi_faults_are_errors_with_one_line)."""
    running = {p.pid for p in fleet.processes(node, include_system=True) if p.cmdline}
    return [p for p in pids if p in running]


def live(fleet: SimFleet, node: str, pids: list[int]) -> list[int]:
    """The PIDs of ``pids`` that still run a program: not a zombie, not in their exit (their
    command line already empty while the kernel closes their files), the rule by which a
    teardown takes a process for gone."""
    running = {p.pid for p in fleet.processes(node, include_system=True) if p.cmdline}
    return [p for p in pids if p in running]


def ssh_g(config: Path, name: str, user: str | None = None) -> dict[str, str]:
    """The user, hostname and port OpenSSH's ``ssh -G`` (with ``-l USER``) says ``config``
    gives ``name``: the judge of what fleetclean reads of an ssh_config."""
    args = ["-l", user] if user else []
    out = subprocess.run(["ssh", "-G", "-F", str(config), *args, name], capture_output=True,
                         text=True, check=True, stdin=subprocess.DEVNULL).stdout
    seen: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        seen.setdefault(key, value)
    return {k: seen[k] for k in ("user", "hostname", "port")}


def sh(fleet: SimFleet, command: str, node: str = "node01") -> str:
    """The output of the shell ``command`` run in ``node``, which must succeed."""
    done = fleet.run_in(node, ["sh", "-c", command])
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout.strip()


@contextlib.contextmanager
def uvm_counted(fleet: SimFleet, node: str, count: int | None) -> Iterator[None]:
    """The node's count of open /dev/nvidia-uvm files (render.UVM_REFCNT), which picks a
    status script's GPU read, made ``count`` inside the block (as where a CUDA process holds
    no context, or has started just after the script read the count; None: no such file, as
    on a node whose sysfs hides its modules), and counted anew by the node's init after it
    (sim/uvm_count.py), whatever started or ended meanwhile."""
    if count is None:
        fleet.node_path(node, UVM_REFCNT).unlink()
    else:
        fleet.node_path(node, UVM_REFCNT).write_text(f"{count}\n")
    try:
        yield
    finally:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(uvm_count.TIMEOUT_S)
            conn.connect(str(fleet.node_path(node, uvm_count.SOCKET)))
            while conn.recv(64):
                pass


def reset_node(fleet: SimFleet, node: str = "node01") -> None:
    """Back to an idle node for the next test of a module that shares the fleet: every
    workload killed by PID (the node's own daemons stay), faults and leaks cleared."""
    fleet.set_fault(node, "unstick")
    pids = [str(p.pid) for p in fleet.processes(node)]
    if pids:
        fleet.run_in(node, ["kill", "-KILL", *pids])
    fleet.set_fault(node, "none")
    for gpu in range(8):
        fleet.set_fault(node, "leak", gpu, 0)
    fleet.set_fault(node, "reset-policy", "strict")
    fleet.run_in(node, ["nvidia-smi", "-pm", "1"])
    deadline = time.monotonic() + 30
    while fleet.processes(node) or fleet.gpu_used_mib(node) != [0] * 8:
        assert time.monotonic() < deadline, f"{node} did not come back to idle"
        time.sleep(0.05)


def down_checked(fleet: SimFleet) -> None:
    """Stop ``fleet`` and fail if any process it started outlives ``down``."""
    from fleetclean.sim import pids as sim_pids

    recorded = sim_pids.load(fleet.layout.pid_file)
    fleet.down()
    release_subnet(fleet_subnet(fleet))
    left = [e for e in recorded if sim_pids.is_alive(e)]
    assert not left, f"simulator processes left after down: {left}"


# What an HPC node's startup files may export to every bash they start: Lmod's BASH_ENV,
# a site's `export -f` wrappers (here of nvidia-smi and of bash's own kill), and shell
# options exported with SHELLOPTS and BASHOPTS.
HOSTILE_BASHRC = """\
export BASH_ENV=/root/bash_env.sh
nvidia-smi() { echo 'No devices were found'; return 6; }
kill() { echo 'kill: not here' >&2; return 1; }
export -f nvidia-smi kill
shopt -s nocasematch; export BASHOPTS
set -o errexit -o nounset; export SHELLOPTS
export POSIXLY_CORRECT=1
"""


def skip_unless_own_root(fleet: SimFleet, node: str = "node01") -> None:
    """Skip unless ``node``'s /root is its own: it is a tmpfs of the node's, unless the
    Python that runs the nodes lives there (node_init.make_mounts), and then it is this
    machine's, which no test may write (a test that writes a ~/.bashrc)."""
    if os.stat(fleet.node_path(node, "/root")).st_dev == os.stat("/root").st_dev:
        pytest.skip("the nodes share this machine's /root (Python lives under it)")


def user_namespace_refusal() -> str | None:
    """Why a user other than root may not make a user namespace on this machine (a rootless
    Docker's RootlessKit must, and so must the simulator's: ``sim/dockerd.py``), or None
    where one may. Asked of util-linux's ``unshare`` as nobody."""
    as_nobody: dict[str, Any] = {"user": 65534, "group": 65534, "extra_groups": []}
    try:
        done = subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                              capture_output=True, text=True, timeout=30, check=False,
                              **(as_nobody if os.geteuid() == 0 else {}))
    except OSError as exc:
        return f"no unshare to ask: {exc}"
    if done.returncode != 0:
        return f"no user namespace for a user here: {done.stderr.strip()}"
    return None


def wait_for(what: str, ok: Callable[[], bool], seconds: float = 60) -> None:
    """Poll ``ok`` every 0.1 s until it holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not ok():
        assert time.monotonic() < deadline, f"not within {seconds:g}s: {what}"
        time.sleep(0.1)


def stop_cli(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C to a fleetclean this test started (by its PID), killed if it does not stop
    within 30 s (never left behind, watching whatever fleet comes next); its stdout and
    stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def spawn_cli(tmp_path: Path, *argv: str) -> subprocess.Popen[str]:
    """fleetclean in a subprocess of this test (signalled only by its PID), its run records
    in the test's own state dir."""
    env = dict(os.environ, FLEETCLEAN_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1")
    return subprocess.Popen([sys.executable, "-m", "fleetclean", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def shellcheck_path() -> str | None:
    """The shellcheck the venv has (scripts/dev setup installs one), else the PATH's."""
    import shutil

    local = Path(sys.executable).parent / "shellcheck"
    return str(local) if local.exists() else shutil.which("shellcheck")


# What the rendered scripts are checked with. shellcheck's dataflow analysis (on by default
# since 0.10) costs 3-4x the time of the rest on a 130 KB script and found nothing in the
# glue rendering adds: it looks inside functions, and every function a script carries is a
# stage template's, which test_stage_templates_pass_shellcheck checks with it on. Off, the
# six golden scripts took 13 s of CPU instead of 65 s, in a suite near CI's 10 minutes.
RENDERED = ("-s", "bash", "--extended-analysis=false")


def shellcheck_each(files: Sequence[str | Path], *args: str,
                    extra: Mapping[str, Sequence[str]] | None = None) -> tuple[int, str]:
    """shellcheck (with ``args``, and for a file whose name is in ``extra`` those too) of
    each file in a process of its own, all at once: (the worst exit status, their reports).
    One shellcheck over several rendered scripts, each carrying the whole stage library,
    takes them one after another, where the other test worker leaves a core idle while its
    simulated nodes sleep."""
    from concurrent.futures import ThreadPoolExecutor

    tool = shellcheck_path()
    assert tool is not None
    more = extra or {}

    def one(path: str | Path) -> subprocess.CompletedProcess[str]:
        argv = [tool, *args, *more.get(Path(path).name, ()), str(path)]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    with ThreadPoolExecutor(max_workers=max(1, len(files))) as pool:
        done = list(pool.map(one, files))
    return max((d.returncode for d in done), default=0), "".join(d.stdout for d in done)
