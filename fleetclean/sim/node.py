"""One simulated node seen from the host: its files, its init, its listener, its processes.

A node is a directory (``nodes/nodeNN`` in the state dir, bind-mounted at
``/run/fleetclean`` inside the node) and an init process (``node_init.py``) that is PID 1
of the node's PID namespace. The host talks to the init only through that directory and
signals sent by PID (see ``node_init`` for the protocol), and enters the node with
nsenter(1) for everything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetclean.errors import SimError
from fleetclean.sim import accounts, cgroups, faults, nodecg, pids, sshfiles
from fleetclean.sim.bootlog import boot_log
from fleetclean.sim.layout import IN_NODE_CODE, IN_NODE_DIR, PACKAGE_DIR, node_python
from fleetclean.sim.sshfiles import LIFTED

GPU_COUNT = 8
# The PCI bus ids of the eight GPUs of a typical HGX H200 board.
BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
FAULTS = tuple(faults.FAULTS)
LISTENER_MODES = ("sshd", "off", "blackhole", "slow-banner", "slow-auth", "stall",
                  "latency")
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LISTENER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SimNode:
    """A node of the fleet: ``init_pid`` is the host PID of the node's PID 1."""

    name: str
    address: str
    init_pid: int
    dir: Path


@dataclass(frozen=True)
class SimProcess:
    """A process inside a node: ``pid``/``ppid`` as the node sees them (ppid 0: the
    parent is outside the node), ``host_pid`` as the host sees it."""

    pid: int
    ppid: int
    cmdline: str
    host_pid: int


def gpu_uuid(fleet_id: str, node: str, index: int) -> str:
    """Stable per node and GPU, shaped like ``GPU-fa529bc3-df9c-8e3c-22fb-c95e99d1c9dc``."""
    h = hashlib.sha256(f"{fleet_id}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def prepare(
    node_dir: Path, name: str, address: str, fleet_id: str, client_pub: str, *,
    password_hash: str, sshd_defaults: bool = False, minors: Sequence[int] | None = None,
    host_ca: Path | None = None,
) -> None:
    """Write everything a node needs before its init starts: host key, sshd_config,
    authorized_keys, accounts and sudo (``accounts``), GPU facts, the nvidia-smi wrapper,
    and the wanted listener.

    nvidia-smi numbers GPUs in PCI bus order; the driver names each one's device file by
    its minor number, in the order it probed them, which need not be the same. ``minors``
    gives GPU index i the file ``/dev/nvidia{minors[i]}`` (default: the index itself).
    ``host_ca``: the host key is signed by that CA key, and sshd shows the certificate."""
    (node_dir / "bin").mkdir(parents=True, exist_ok=True)
    # Seen inside the node as /run/fleetclean: sshd's StrictModes checks it for root's
    # keys, and the login accounts' nvidia-smi reads the GPU facts in it.
    node_dir.chmod(0o755)
    accounts.write_etc(node_dir, name, address, password_hash)
    sshfiles.keygen(node_dir / sshfiles.HOST_KEY, f"root@{name}")
    if host_ca is not None:
        sshfiles.sign_host_key(host_ca, node_dir, f"{name} host key", (name, address))
    write_sshd_configs(node_dir, address, *((None, None) if sshd_defaults else LIFTED))
    (node_dir / "authorized_keys").write_text(client_pub + " fleetclean-sim\n")
    order = list(minors) if minors is not None else list(range(GPU_COUNT))
    if sorted(order) != list(range(GPU_COUNT)):
        raise SimError(f"GPU minors must be 0-{GPU_COUNT - 1} in some order, not {order}")
    gpus = [
        {"index": i, "uuid": gpu_uuid(fleet_id, name, i), "bus_id": f"00000000:{bus}:00.0",
         "minor": order[i]}
        for i, bus in enumerate(BUS_IDS)
    ]
    (node_dir / "gpus.json").write_text(json.dumps({"name": name, "gpus": gpus}))
    (node_dir / "sshd.log").touch()
    (node_dir / "kern.log").touch()
    install_nvidia_smi(node_dir)
    install_dmesg(node_dir)
    (node_dir / "listener.want").write_text("1 sshd\n")


def write_sshd_configs(node_dir: Path, address: str, max_startups: str | None = LIFTED[0],
                       max_sessions: int | None = LIFTED[1]) -> None:
    """The node's sshd_config, and the one for sshd behind the slow/stalling proxy (an
    inner port of the same address); read when the listener (re)starts. Where the node's
    host key has a certificate, sshd shows it."""
    certificate = (node_dir / sshfiles.HOST_CERT).exists()
    for name, port in (("sshd_config", 22), ("sshd_config.inner", sshfiles.INNER_PORT)):
        (node_dir / name).write_text(sshfiles.sshd_config(
            address, IN_NODE_DIR, port, max_startups=max_startups, max_sessions=max_sessions,
            certificate=certificate))


def show_certificate(node_dir: Path) -> None:
    """The node's sshd configs made to show its host key's certificate where it has one,
    and none where it has none (read when sshd restarts); its limits stay as they are."""
    wanted = f"HostCertificate {IN_NODE_DIR}/{sshfiles.HOST_CERT}"
    has = (node_dir / sshfiles.HOST_CERT).exists()
    for name in ("sshd_config", "sshd_config.inner"):
        path = node_dir / name
        lines = [ln for ln in path.read_text().splitlines()
                 if not ln.startswith("HostCertificate ")]
        if has:
            at = next(i for i, ln in enumerate(lines) if ln.startswith("HostKey ")) + 1
            lines.insert(at, wanted)
        path.write_text("\n".join(lines) + "\n")


def install_nvidia_smi(node_dir: Path) -> None:
    # The code as the node binds it: reachable by every account, wherever the checkout is.
    script = f"{IN_NODE_CODE}/nvidia_smi.py"
    # -E, not -I: the script imports its sibling modules through sys.path[0].
    _install(node_dir, "nvidia-smi", f'#!/bin/sh\nexec {node_python()} -S -E {script} "$@"\n')


def install_dmesg(node_dir: Path) -> None:
    """The node's kernel log: ``dmesg`` prints the boot's messages (``bootlog``: a real
    node's 160 KB, never empty) and then kern.log (the Xid faults); ``-C`` clears both
    (``-c`` prints them first), as the real one clears its ring buffer. Both files hold
    the records as the kernel keeps them, and util-linux's own dmesg formats them (``-F``):
    a real log's cost, 4-5 ms of CPU for 160 KB, where ``cat`` took 1 ms; one process
    unless a fault was logged, as the real one is. ``-l LEVELS`` prints only those levels,
    as util-linux's does; without util-linux the node's dmesg refuses it, as busybox's."""
    _install(node_dir, BOOT_LOG, boot_log(), mode=0o644)
    real = shutil.which("dmesg", path="/usr/bin:/bin:/usr/sbin:/sbin")
    # -F, the file to format, last: the levels go before it. Without util-linux no -l
    # arrives here (the script refuses it); the script's $show is a flag.
    fmt = f'{real} ${{level:+-l "$level"}} -F' if real else "sed 's/^<[0-9]*>//'"
    boot, kern = f"/usr/local/sbin/{BOOT_LOG}", f"{IN_NODE_DIR}/kern.log"
    _install(
        node_dir,
        "dmesg",
        "#!/bin/sh\n"
        "# The simulated node's kernel ring buffer (fleetclean.sim.node.install_dmesg).\n"
        f"boot={boot}\n"
        f"[ -e {IN_NODE_DIR}/kern.cleared ] && boot=\n"
        "clear= show=1 level=\n"
        'while [ $# -gt 0 ]; do case $1 in -C|--clear) clear=1 show=;; '
        "-c|--read-clear) clear=1;; -l|--level) level=$2; shift;; esac; shift; done\n"
        + ("" if real else '[ -z "$level" ] || exit 1\n')
        + f'if [ -z "$clear" ] && [ ! -s {kern} ]; then\n'
        f'    if [ -n "$boot" ]; then exec {fmt} "$boot"; fi\n'
        "    exit 0\n"
        "fi\n"
        'if [ -n "$show" ]; then\n'
        f'    if [ -n "$boot" ]; then {fmt} "$boot"; fi\n'
        f'    if [ -s {kern} ]; then {fmt} {kern}; fi\n'
        "fi\n"
        f'[ -z "$clear" ] || {{ : > {kern}; : > {IN_NODE_DIR}/kern.cleared; }}\n',
    )


# The boot's kernel messages, beside dmesg in every node's bin dir (/usr/local/sbin there).
BOOT_LOG = "dmesg-boot.log"


def _install(node_dir: Path, name: str, text: str, mode: int = 0o755) -> None:
    """Put the fleet's one copy of the script ``name`` in the node's bin dir, a hard link
    (every node's is the same text: a thousand copies cost a thousand writes and inodes);
    left as it is when the node already has it."""
    target = node_dir / "bin" / name
    if target.exists():
        return
    shared = node_dir.parent.parent / SHARED_BIN / name
    if not shared.exists() or shared.read_text() != text:
        shared.parent.mkdir(exist_ok=True)
        tmp = shared.with_name(f".{name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(shared)
    try:
        os.link(shared, target)
    except FileExistsError:
        pass
    except OSError:  # another file system: a copy
        target.write_text(text)
        target.chmod(mode)


# Below the state dir, beside nodes/: the scripts every node's bin dir links to.
SHARED_BIN = "node-bin"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def set_fault(node_dir: Path, fault: str, args: Sequence[str] = ()) -> None:
    """A non-SSH fault (see ``faults``); ``missing`` removes nvidia-smi from the node's
    PATH, every other one puts it back."""
    faults.apply(node_dir, fault, list(args))
    if fault == "missing":
        (node_dir / "bin" / "nvidia-smi").unlink(missing_ok=True)
    else:
        install_nvidia_smi(node_dir)


# Room in the argv area and environment block of every node's init: what it forks without
# exec'ing (nvidia-persistenced) rewrites them in place (proctitle.set_title, set_environ).
ARGV_ROOM = 96
ENV_ROOM = 512
ENV_PAD = "FLEETCLEAN_SIM_PAD"
ZYGOTE_TIMEOUT_S = 120.0


def start_inits(nodes: Sequence[tuple[Path, str]], pid_file: Path, *, persistenced: bool,
                on_start: Callable[[subprocess.Popen[bytes]], None]) -> dict[str, int]:
    """Start the inits of ``nodes`` (node dir, address) through one zygote (``zygote.py``)
    and return node name -> host PID of its init, each recorded in ``pid_file`` (by the
    zygote, before the init runs) as ``init:NODE``. ``on_start`` gets the zygote's Popen
    as soon as it runs (for the caller to record and reap). ``persistenced``: each init
    forks its nvidia-persistenced before its listener comes up. SimError if a node could
    not be started (the others are recorded: ``down`` stops them)."""
    env = dict(os.environ)
    size = sum(len(k) + len(v) + 2 for k, v in env.items())
    if size < ENV_ROOM:
        env[ENV_PAD] = "x" * (ENV_ROOM - size)
    argv = [node_python(), "-S", "-E", str(PACKAGE_DIR / "zygote.py"), str(pid_file),
            " " * ARGV_ROOM]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    on_start(proc)
    want = "1" if persistenced else "0"
    text = "".join(f"{d} {address} {d.name} {want}\n" for d, address in nodes)
    try:
        out, err = proc.communicate(text.encode(), timeout=ZYGOTE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        raise SimError(f"the nodes' zygote did not finish in {ZYGOTE_TIMEOUT_S:.0f} s") from exc
    started: dict[str, int] = {}
    failed: list[str] = []
    for line in out.decode().splitlines():
        name, pid = line.split()
        if pid == "!":
            failed.append(name)
        else:
            started[name] = int(pid)
    missing = [d.name for d, _ in nodes if d.name not in started and d.name not in failed]
    if failed or missing or proc.returncode != 0:
        bad = (failed + missing)[:1]
        why = log_tail(nodes[0][0].parent / bad[0]) if bad else err.decode().strip()[-300:]
        raise SimError(f"{len(failed) + len(missing)} node(s) did not start "
                       f"(zygote exit {proc.returncode}): {', '.join(bad)}: {why}")
    return started


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def listener_state(node_dir: Path) -> tuple[int, str, int]:
    """(generation, mode or ``error``, listener pid in the node); (0, "", 0) if none yet."""
    gen, mode, pids_ = listener_pids(node_dir)
    return gen, mode, (pids_ or [0])[0]


def listener_pids(node_dir: Path) -> tuple[int, str, list[int]]:
    """Like listener_state, with every listener process (a proxy and its inner sshd)."""
    try:
        gen, mode, *found = (node_dir / "listener.state").read_text().split()
        return int(gen), mode, [int(p) for p in found]
    except (OSError, ValueError):
        return 0, "", []


def wait_listener(node: SimNode, gen: int, timeout: float = LISTENER_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got, mode, _ = listener_state(node.dir)
        if got >= gen:
            if mode == "error":
                raise SimError(f"{node.name}: sshd did not start; {log_tail(node.dir)}")
            return
        if pids.stat_fields(node.init_pid) is None:
            raise SimError(f"{node.name}: node init exited; {log_tail(node.dir)}")
        time.sleep(0.005)
    raise SimError(f"{node.name}: listener not up after {timeout:.0f} s; {log_tail(node.dir)}")


def log_tail(node_dir: Path) -> str:
    parts = []
    for name in ("init.log", "sshd.log"):
        try:
            lines = (node_dir / name).read_text(errors="replace").strip().splitlines()
        except OSError:
            continue
        if lines:
            parts.append(f"{name}: {' | '.join(lines[-3:])}")
    return "; ".join(parts) or "no log"


def set_listener(node: SimNode, init: pids.Recorded, mode: str, seconds: float = 0) -> None:
    """Make the node listen with ``mode`` (``sshd``, ``off``, ``blackhole``, or sshd
    behind a ``slow-banner``/``slow-auth``/``stall``/``latency`` proxy delaying by ``seconds``) and
    wait until it does; always restarts the listener (so a new host key is read)."""
    if mode not in LISTENER_MODES:
        raise SimError(f"unknown listener mode {mode!r}")
    gen = int((node.dir / "listener.want").read_text().split()[0]) + 1
    write_atomic(node.dir / "listener.want", f"{gen} {mode} {seconds}\n")
    if not pids.signal_entry(init, signal.SIGUSR1):
        raise SimError(f"{node.name} is not running (init pid {node.init_pid} is gone)")
    wait_listener(node, gen)


def ns_pid(host_pid: int) -> int | None:
    """The PID a process has in its innermost PID namespace."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except OSError:
        return None
    return None


def system_pids(node_dir: Path) -> set[int]:
    """Node PIDs of the node's own daemons (nvidia-persistenced started by ``up``, the
    stuck driver), as ``launcher.py`` records them in the node dir."""
    try:
        return {int(w) for w in (node_dir / "system_pids").read_text().split()}
    except (OSError, ValueError):
        return set()


def processes(node: SimNode, include_system: bool = False) -> list[SimProcess]:
    """Every live process of the node, found by walking the tree under its init (orphans
    are reparented to it, so nothing is missed), sorted by node PID. Without
    ``include_system``, the init, the SSH listener and the node's own daemons (see
    ``system_pids``) are left out; zombies always are, but a zombie main thread whose
    process lives on in another thread (``pids.live_thread``), read by that thread."""
    listeners = [*listener_pids(node.dir)[2], *system_pids(node.dir)]
    found: list[SimProcess] = []
    stack = [(node.init_pid, 0)]
    while stack:
        host_pid, parent = stack.pop()
        pid = ns_pid(host_pid)
        fields = pids.stat_fields(host_pid)
        if pid is None or fields is None:
            continue
        for child in child_pids(host_pid):
            stack.append((child, pid))
        where = f"/proc/{host_pid}"
        if fields[0] == "Z":
            tid = pids.live_thread(host_pid)
            if tid is None:
                continue
            where = f"/proc/{host_pid}/task/{tid}"
        if not include_system and (pid == 1 or pid in listeners):
            continue
        try:
            raw = Path(f"{where}/cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace").rstrip()
        found.append(SimProcess(pid, parent, cmdline, host_pid))
    return sorted(found, key=lambda p: p.pid)


def node_env(user: str = "root") -> dict[str, str]:
    """The environment of commands run inside a node as ``user``: what an SSH session
    gets."""
    home = "/root" if user == "root" else accounts.user(user).home
    return {"PATH": NODE_PATH, "HOME": home, "LANG": "C.UTF-8", "USER": user, "LOGNAME": user}


def nsenter(node: SimNode, argv: Sequence[str], where: str = "", *, uts: bool = False,
            user: str = "root") -> list[str]:
    """argv that runs ``argv`` inside the node's PID and mount namespaces and, when the
    fleet has cgroups, inside its cgroup namespace and tree: at the node's root, or in the
    unit ``where`` (``system.slice/slurmd.service``); ``uts``: also its hostname; as
    ``user`` (an account ``accounts.user`` knows: its uid, gid and groups, as a login would
    have them; KeyError for another)."""
    roots = cgroup_paths(node.dir, where)
    flags = ["-p", "-m", *(["-u"] if uts else []), *(["-C"] if roots else [])]
    drop: list[str] = []
    if user != "root":
        uid = accounts.user(user).uid
        # setpriv runs inside the node, so --init-groups reads the node's /etc/group.
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--init-groups", "--"]
    inner = ["nsenter", "-t", str(node.init_pid), *flags, "--", *drop, *argv]
    return cgroups.join_argv(roots, inner)


def cgroup_paths(node_dir: Path, where: str = "") -> list[str]:
    """Host paths of the node's cgroups for a process placed as systemd places unit
    ``where`` (the node's root when empty), made if missing; [] without cgroups."""
    try:
        config = nodecg.read_config((node_dir / nodecg.CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return []
    if config is None:
        return []
    placement = nodecg.unit_placement(where) if where else nodecg.everywhere("/")
    paths = []
    for h in config.get("hierarchies", []):
        rel = placement[nodecg.role(h["key"])].strip("/")
        path = os.path.join(h["host"], rel) if rel else h["host"]
        os.makedirs(path, exist_ok=True)
        paths.append(path)
    return paths
