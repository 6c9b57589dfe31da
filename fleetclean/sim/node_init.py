"""PID 1 of one simulated node: mounts, the SSH listener, and zombie reaping.

Forked by the fleet's zygote (``zygote.py``: one interpreter that imported this module
once, then per node joins the node's cgroups, unshares the PID, mount, UTS and cgroup
namespaces and forks the node's PID 1, which calls ``run``), or run as a script under
``unshare --pid --mount --uts --fork --mount-proc -- python3 node_init.py NODE_DIR ADDRESS
HOSTNAME``. Mount propagation is private, so nothing here leaks to the host. Standard
library only: this file runs inside nodes, never imported through the ``fleetclean``
package there.

Contract with the host (``fleetclean.sim.node``), all through files in NODE_DIR, which is
bind-mounted at ``/run/fleetclean`` inside the node:

- ``listener.want`` holds ``GEN MODE [SECONDS]`` (MODE: ``sshd``, ``off``, ``blackhole``,
  or ``slow-banner``/``slow-auth``/``stall``/``latency``: sshd on port 2222 behind
  ``sshproxy.py``).
  On SIGUSR1 the init stops whatever listens on ADDRESS:22 and starts MODE, then writes
  ``listener.state`` = ``GEN MODE PID [SSHD_PID]`` (``GEN error 0`` when it would not start).
- SIGTERM: stop the listener and exit; the kernel then kills everything in the namespace.
  SIGKILL from the host does the same without the courtesy.
- It also mounts the node's own accounts and sudo configuration (``make_accounts``),
  answers GPU queries of accounts other than root on ``smi_driver.SOCKET`` (one thread),
  keeps ``/sys/module/nvidia_uvm/refcnt`` (``uvm_count``, one thread), and, when asked,
  forks the node's nvidia-persistenced (``start_persistenced``) before its listener first
  comes up.

Example: ``echo "2 off" > listener.want; kill -USR1 INIT`` makes the node refuse SSH
connections while its workloads keep running.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
import zlib

if __package__:
    from fleetclean.sim import nodecg, programs, smi_driver, smi_state, uvm_count
    from fleetclean.sim.proctitle import set_environ, set_plain_title, set_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import programs  # type: ignore[import-not-found,no-redef]
    import smi_driver  # type: ignore[import-not-found,no-redef]
    import smi_state  # type: ignore[import-not-found,no-redef]
    import uvm_count  # type: ignore[import-not-found,no-redef]
    from proctitle import (  # type: ignore[import-not-found,no-redef]
        set_environ,
        set_plain_title,
        set_title,
    )

IN_NODE_DIR = "/run/fleetclean"
SSH_PORT = 22
INNER_PORT = 2222  # sshd's port behind sshproxy.py (sshfiles.INNER_PORT)
NULL_DEVICE = (1, 3)

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]


def mount(source: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    """mount(2) through libc: Python 3.11 has no os.mount, and 20 forks of mount(8)
    per node would dominate the start-up time of a 64-node fleet."""
    rc = _libc.mount(
        source.encode(), target.encode(), fstype.encode(), flags, data.encode() or None
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} ({fstype}): {os.strerror(err)}")


def make_dev() -> None:
    """Give the node its own /dev: the basics sshd and shells need, a private pty
    instance, a private /dev/shm, and fake GPU device files.

    The GPU files are character devices, as Slurm's gres plugin requires of a ``File=``;
    with no NVIDIA driver here they are /dev/null's (1:3), harmless to open, and fuser, lsof
    and /proc/PID/fd see a process holding one exactly as a real one. Each GPU's file is
    named by its minor number, which need not be its index (see ``node.prepare``).
    /dev/nvidia-caps is a directory, as on a real host, so that scripts globbing
    /dev/nvidia* meet one.
    """
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name, major, minor in (
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
        # FUSE, as on any Linux host: the node's stuck driver (stuckfs.py) serves through it.
        ("fuse", 10, 229),
    ):
        os.mknod(f"/dev/{name}", 0o20666, os.makedev(major, minor))
        os.chmod(f"/dev/{name}", 0o666)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/pts", 0o755)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666")
    os.mkdir("/dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    gpus = read_gpus()
    names = [f"nvidia{gpu['minor']}" for gpu in gpus]
    names += ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    for name in names:
        os.mknod(f"/dev/{name}", 0o20666, os.makedev(*NULL_DEVICE))
        os.chmod(f"/dev/{name}", 0o666)
    os.mkdir("/dev/nvidia-caps", 0o755)
    make_driver_info(gpus)
    # The node's own /sys/module, with the nvidia_uvm module's reference count that its
    # init keeps (uvm_count.serve): this machine's modules stay out of view.
    mount("tmpfs", uvm_count.MODULES, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755")
    os.mkdir(os.path.dirname(uvm_count.REFCNT), 0o755)
    os.mkdir(os.path.join(uvm_count.MODULES, "nvidia"), 0o755)  # the driver's own module


def read_gpus() -> list[dict[str, object]]:
    """The node's GPUs as ``node.prepare`` wrote them: index, uuid, bus_id, minor."""
    with open(os.path.join(IN_NODE_DIR, "gpus.json")) as f:
        gpus: list[dict[str, object]] = json.load(f)["gpus"]
    for gpu in gpus:
        gpu.setdefault("minor", gpu["index"])
    return gpus


def make_driver_info(gpus: list[dict[str, object]]) -> None:
    """``/proc/driver/nvidia/gpus/BUS/information`` as the driver writes it: where a tool
    learns which ``/dev/nvidiaN`` (the minor number) is which GPU of nvidia-smi's (bus
    order); Slurm's GPU ids are those minors. A tmpfs over the node's own /proc/driver."""
    mount("tmpfs", "/proc/driver", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555")
    for gpu in gpus:
        bus = str(gpu["bus_id"])[4:].lower()  # 00000000:18:00.0 -> 0000:18:00.0
        directory = f"/proc/driver/nvidia/gpus/{bus}"
        os.makedirs(directory, 0o555)
        with open(f"{directory}/information", "w") as f:
            f.write(
                "Model: \t\t NVIDIA H200\n"
                "IRQ:   \t\t 0\n"
                f"GPU UUID: \t {gpu['uuid']}\n"
                "Video BIOS: \t 96.00.af.00.01\n"
                "Bus Type: \t PCIe\n"
                "DMA Size: \t 52 bits\n"
                "DMA Mask: \t 0xfffffffffffff\n"
                f"Bus Location: \t {bus}\n"
                f"Device Minor: \t {gpu['minor']}\n"
                "GPU Excluded:\t No\n"
            )


def make_mounts(node_dir: str) -> None:
    """Private /run (sshd's privilege-separation dir and our control files), /dev, /tmp,
    /var/log, an empty home for root, and the node's bin dir over /usr/local/sbin, which is
    on root's
    sshd PATH. The simulator's own code stays visible where it is, even when it lives
    under /tmp or /root (a checkout in /tmp, as CI makes)."""
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    os.mkdir("/run/sshd", 0o755)
    os.mkdir(IN_NODE_DIR, 0o755)
    # Bound before /tmp is covered below: the state dir may well live under /tmp.
    mount(node_dir, IN_NODE_DIR, "", MS_BIND)
    mount(os.path.join(node_dir, "bin"), "/usr/local/sbin", "", MS_BIND)
    make_dev()
    code = os.path.dirname(os.path.realpath(__file__))
    os.mkdir(CODE_KEEP, 0o755)
    mount(code, CODE_KEEP, "", MS_BIND)
    # The whole checkout (or site-packages) the simulator runs from stays visible where it
    # is, with a virtual environment inside it: a controller run inside a node (the -c local
    # tests) imports fleetclean and its packages from there. Binding only fleetclean/sim
    # made "fleetclean" a namespace package without __main__ in a checkout under /tmp.
    checkout = os.path.dirname(os.path.dirname(code))
    os.mkdir(CHECKOUT_KEEP, 0o755)
    mount(checkout, CHECKOUT_KEEP, "", MS_BIND)
    keeps = [(CHECKOUT_KEEP, checkout)]
    # The fleet's shared dir (munge socket, slurm.conf: see sim/slurm.py), when there is
    # one, is seen by every node at its host path, so one config serves host and nodes.
    shared = os.path.realpath(os.path.join(node_dir, "..", "..", "shared"))
    if os.path.isdir(shared):
        os.mkdir(SHARED_KEEP, 0o755)
        mount(shared, SHARED_KEEP, "", MS_BIND)
        keeps.append((SHARED_KEEP, shared))
        # Slurm's clients in the node (a login node's sinfo, an epilog's tools) find the
        # fleet's slurm.conf where Debian's build looks for it, as on a real cluster.
        if os.path.isdir(os.path.join(shared, "slurm")) and os.path.isdir("/etc/slurm"):
            mount(os.path.join(shared, "slurm"), "/etc/slurm", "", MS_BIND)
    cover("/tmp", "mode=1777", keeps)
    # A node's logs are its own (an epilog writes /var/log/fleetclean/), never this host's.
    cover("/var/log", "mode=0755", keeps)
    # A node is another machine: root's home there must not be this host's, whose dotfiles
    # (a pyenv init in .bashrc, say) would run in every SSH session. Left alone when the
    # Python running this init lives there.
    home = os.path.expanduser("~root")
    if not _under(os.path.realpath(sys.executable), home):
        cover(home, "mode=0700", keeps)
    make_accounts(keeps)


CODE_KEEP = "/run/fleetclean-code"  # layout.IN_NODE_CODE
CHECKOUT_KEEP = "/run/fleetclean-checkout"
SHARED_KEEP = "/run/fleetclean-shared"
PYTHON_KEEP = "/run/fleetclean-python"
SUDO = "/usr/bin/sudo"
# Node file (under IN_NODE_DIR/etc, written by sim/accounts.py) -> the path it covers.
ACCOUNT_FILES = (
    ("passwd", "/etc/passwd"),
    ("group", "/etc/group"),
    ("shadow", "/etc/shadow"),
    ("hosts", "/etc/hosts"),
    # The directory service (accounts.DIRECTORY_USERS), where this machine can serve it.
    ("nsswitch.conf", "/etc/nsswitch.conf"),
    ("extrausers", "/var/lib/extrausers"),
)
DIRECTORY_FILES = ("nsswitch.conf", "extrausers")
SUDO_FILES = (
    ("sudoers", "/etc/sudoers"),
    ("sudoers.d", "/etc/sudoers.d"),
    ("pam.d-sudo", "/etc/pam.d/sudo"),
    ("sudo-lib", "/var/lib/sudo"),
)


def make_accounts(keeps: list[tuple[str, str]]) -> None:
    """The node's own accounts, sudo configuration and home directories.

    Each file is bind-mounted over this machine's inside the node's mount namespace only
    (propagation is private), so nothing of the host's is read or changed; sudo's state
    (/run/sudo/ts) lands in the node's /run, its lecture marks in the node's /var/lib/sudo.
    /home becomes the node's own tmpfs with a home per login account, owned as sshd's
    StrictModes wants: home and ~/.ssh the user's and 0700, authorized_keys 0600 holding
    the fleet's client key.
    """
    etc = os.path.join(IN_NODE_DIR, "etc")
    if not os.path.isdir(etc):
        return
    # The accounts always (a node never reads this machine's); the directory service
    # only where this machine can serve it (accounts.has_directory wrote its files).
    pairs = [p for p in ACCOUNT_FILES if p[0] not in DIRECTORY_FILES
             or (os.path.exists(os.path.join(etc, p[0])) and os.path.exists(p[1]))]
    if os.access(SUDO, os.X_OK):
        pairs += [p for p in SUDO_FILES if os.path.exists(p[1])]
    for name, target in pairs:
        mount(os.path.join(etc, name), target, "", MS_BIND)
    python = os.path.realpath(sys.base_prefix)
    if _under(python, "/home"):
        os.mkdir(PYTHON_KEEP, 0o755)
        mount(python, PYTHON_KEEP, "", MS_BIND)
        keeps = [*keeps, (PYTHON_KEEP, python)]
    cover("/home", "mode=0755", keeps)
    with open(os.path.join(IN_NODE_DIR, "authorized_keys")) as f:
        key = f.read()
    with open("/etc/passwd") as f:
        people = [line.split(":") for line in f if line.count(":") == 6]
    for _name, _, uid, gid, _, home, _ in people:
        if 1000 <= int(uid) < 60000 and _under(home, "/home"):
            make_home(home, int(uid), int(gid), key)


def make_home(home: str, uid: int, gid: int, key: str) -> None:
    ssh = os.path.join(home, ".ssh")
    keys = os.path.join(ssh, "authorized_keys")
    os.makedirs(ssh, 0o700, exist_ok=True)
    with open(keys, "w") as f:
        f.write(key)
    for path, mode in ((home, 0o700), (ssh, 0o700), (keys, 0o600)):
        os.chown(path, uid, gid)
        os.chmod(path, mode)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def cover(top: str, mode: str, keeps: list[tuple[str, str]]) -> None:
    """Mount an empty tmpfs on ``top``; each ``(kept, path)`` whose path was under it (the
    simulator's code, the fleet's shared dir) is bound back from ``kept`` at the same path,
    so every path the host computed stays valid inside the node."""
    mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, mode)
    for kept, path in keeps:
        if _under(path, top):
            os.makedirs(path, exist_ok=True)
            mount(kept, path, "", MS_BIND)


def is_listening(address: str, port: int) -> bool:
    """True when some socket listens on address:port, read from /proc/net/tcp so that
    no probe connection shows up in sshd's log."""
    want = "{:08X}:{:04X}".format(int.from_bytes(socket.inet_aton(address), "little"), port)
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":
                return True
    return False


def _child_signals() -> None:
    """In a forked child: the signal mask and handlers a fresh process has."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in WAITED:
        signal.signal(sig, signal.SIG_DFL)


# The SSH listener is what systemd runs as ssh.service on a real node; with no pam_systemd
# (UsePAM no), every session and what it starts stays in that cgroup too. Its cgroups'
# cgroup.procs files, made once at start (none without cgroups).
SSH_PROCS: list[str] = []


def spawn(argv: list[str], env: dict[str, str] | None = None) -> int:
    """fork+exec with a clean signal mask (the init blocks the signals it waits for,
    and a blocked mask would otherwise be inherited by sshd and every session), in the
    listener's cgroup; ``env``: added to the init's environment."""
    pid = os.fork()
    if pid == 0:
        try:
            _child_signals()
            nodecg.join(SSH_PROCS)
            os.execve(argv[0], argv, {**os.environ, **(env or {})})
        except BaseException as exc:
            # init.log: why the listener could not start (the host reports its tail).
            print(f"cannot start {argv[0]}: {exc!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(127)
    return pid


def blackhole(address: str) -> int:
    """A listener that accepts TCP connections and never says a word: what a hung sshd
    or a firewall that drops after the handshake looks like to a client."""
    pid = os.fork()
    if pid == 0:
        try:
            _child_signals()
            nodecg.join(SSH_PROCS)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((address, SSH_PORT))
            server.listen(256)
            held = []
            while True:
                conn, _ = server.accept()
                held.append(conn)
        finally:
            os._exit(1)
    return pid


def stop(pid: int) -> None:
    """SIGTERM a child of ours, SIGKILL after 5 s; reaped either way."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


class Init:
    """The node's PID 1: one listener at a time, and every orphan reaped."""

    def __init__(self, node_dir: str, address: str) -> None:
        self.node_dir = node_dir
        self.address = address
        self.listener = 0
        self.inner = 0  # sshd behind a proxy
        self.gen = -1

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.listener:
                self.listener = 0
            if pid == self.inner:
                self.inner = 0

    def stop_listener(self) -> None:
        stopped = False
        for pid in (self.listener, self.inner):
            if pid:
                stop(pid)
                stopped = True
        self.listener = self.inner = 0
        deadline = time.monotonic() + 5
        while stopped and is_listening(self.address, SSH_PORT) and time.monotonic() < deadline:
            time.sleep(0.005)

    def start_listener(self, mode: str, seconds: str) -> str:
        if mode == "off":
            return "off"
        sshd = ["/usr/sbin/sshd", "-D", "-E", f"{IN_NODE_DIR}/sshd.log", "-f"]
        if mode == "blackhole":
            self.listener = blackhole(self.address)
        elif mode == "sshd":
            return mode if self.start_sshd([*sshd, f"{IN_NODE_DIR}/sshd_config"]) else "error"
        else:
            if not self.start_sshd([*sshd, f"{IN_NODE_DIR}/sshd_config.inner"], inner=True):
                return "error"
            proxy = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sshproxy.py")
            self.listener = spawn([sys.executable, "-S", "-E", proxy, self.address, mode, seconds])
        return mode if self.wait_port(self.listener, SSH_PORT) else "error"

    def start_sshd(self, argv: list[str], inner: bool = False) -> bool:
        """Start sshd and wait for its sd_notify READY=1 (Debian's sshd sends it once it
        listens): polling /proc/net/tcp, which lists every socket of the machine, from a
        thousand inits at once cost time quadratic in the fleet's size. False if sshd
        died or 20 s passed first."""
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(NOTIFY_SOCKET)
            notify.bind(NOTIFY_SOCKET)
            pid = spawn(argv, {"NOTIFY_SOCKET": NOTIFY_SOCKET})
            if inner:
                self.inner = pid
            else:
                self.listener = pid
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if select.select([notify], [], [], 0.05)[0]:
                    if b"READY=1" in notify.recv(4096):
                        return True
                    continue
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    return False
            return False
        finally:
            notify.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(NOTIFY_SOCKET)

    def wait_port(self, pid: int, port: int) -> bool:
        """True once ``pid`` listens on our address:port; False if it died or 20 s passed."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if is_listening(self.address, port):
                return True
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return False
            time.sleep(0.005)
        return False

    def reconcile(self) -> None:
        try:
            with open(os.path.join(IN_NODE_DIR, "listener.want")) as f:
                gen_text, mode, *rest = f.read().split()
        except (OSError, ValueError):
            return
        gen = int(gen_text)
        if gen == self.gen:
            return
        self.stop_listener()
        state = self.start_listener(mode, (rest or ["0"])[0])
        self.gen = gen
        tmp = os.path.join(IN_NODE_DIR, "listener.state.tmp")
        with open(tmp, "w") as f:
            f.write(f"{gen} {state} {self.listener}{f' {self.inner}' if self.inner else ''}\n")
        os.rename(tmp, os.path.join(IN_NODE_DIR, "listener.state"))

    def run(self) -> None:
        self.reconcile()
        while True:
            info = signal.sigtimedwait(WAITED, 5.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                self.reap()
            elif info.si_signo == signal.SIGUSR1:
                self.reconcile()
            elif info.si_signo in (signal.SIGTERM, signal.SIGINT) and info.si_pid == 0:
                # si_pid is 0 only for a sender outside the namespace (the host): a
                # `pkill` or `kill -TERM 1` inside the node must not end the node.
                self.stop_listener()
                return


WAITED = (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
# Where sshd's sd_notify finds the init (the node's own /run).
NOTIFY_SOCKET = "/run/fleetclean-sshd-notify"
PERSISTENCED_UNIT = "system.slice/nvidia-persistenced.service"
# What `sim spawn NODE persistenced` (an nsenter and launcher.py) gives the daemon: an SSH
# session's environment, and no GPU memory for nvidia-smi to count (FLEETCLEAN_SIM_GPU_MIB).
PERSISTENCED_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root",
                    "FLEETCLEAN_SIM_GPU_MIB": "0"}


def start_persistenced(tree: nodecg.Tree) -> int:
    """Fork the node's nvidia-persistenced (``programs.persistenced``: every GPU held, no
    memory, SIGHUP re-reads the persistence modes) in its own unit's cgroup and session,
    with the real daemon's command line and comm, recorded as a system PID of the node;
    return once it holds its devices. A fork of this init instead of an nsenter and two
    interpreters per node: a 1,000-node fleet starts in seconds less and 8 MiB a node
    smaller."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            _child_signals()
            os.setsid()
            tree.place(0, nodecg.unit_placement(PERSISTENCED_UNIT))
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            set_environ({**PERSISTENCED_ENV, programs.READY_FD: str(write_end)})
            set_title("", "nvidia-persistenced", argv=programs.PERSISTENCED_ARGV)
            programs.persistenced()
        except BaseException as exc:
            print(f"cannot start nvidia-persistenced: {exc!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(1)
    os.close(write_end)
    ready = b""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and select.select([read_end], [], [], 0.5)[0]:
        chunk = os.read(read_end, 64)
        if not chunk:
            break
        ready += chunk
    os.close(read_end)
    if not ready.strip():
        print("nvidia-persistenced did not come up", file=sys.stderr, flush=True)
        return 0
    with open(os.path.join(IN_NODE_DIR, "system_pids"), "a") as f:
        f.write(f"{pid}\n")
    return pid


def start_pids(hostname: str) -> None:
    """The node's next PID, a point of its own (from its name, so the same run after run),
    as a real node's PIDs are its own (its uptime, its services): started alike, every
    node gave its server the same PIDs, and text that names them read the same on every
    host, where on a real fleet it differs (a problem line folded hosts that a real fleet
    would list one by one). Under half of ``pid_max``, so a node never runs out."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            room = min(int(f.read()) // 2, 30000) - 300
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(300 + zlib.crc32(hostname.encode()) % max(room, 1)))
    except (OSError, ValueError) as exc:
        print(f"node PIDs start at 1: {exc!r}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    node_dir, address, hostname = argv[1], argv[2], argv[3]
    # First, while the host's cgroup paths are still in view: the node's own cgroup root.
    cgroups = nodecg.join_and_unshare(node_dir)
    run(node_dir, address, hostname, cgroups, persistenced=len(argv) > 4 and argv[4] == "1")
    return 0


def run(node_dir: str, address: str, hostname: str, cgroups: dict[str, object] | None, *,
        persistenced: bool = False) -> None:
    """Everything PID 1 does once in the node's namespaces (its cgroups joined, ``cgroups``
    being what ``nodecg.join_and_unshare`` returned); returns when the host stops it."""
    # A handler, not SIG_DFL: the kernel drops default-action signals sent to a
    # namespace's PID 1. Blocked + sigtimedwait makes the loop race-free.
    for sig in WAITED:
        signal.signal(sig, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    # A real node's PID 1 is systemd; a python3 here would be hit by `pkill python3`.
    set_plain_title("/sbin/init", "init")
    socket.sethostname(hostname)
    make_mounts(node_dir)
    # Before the node's first fork (nvidia-persistenced, sshd): ns_last_pid is this PID
    # namespace's, the init's own.
    start_pids(hostname)
    tree = nodecg.Tree(cgroups)
    if cgroups is not None:
        nodecg.mount_hierarchies(cgroups, mount)
        # Where a real node's PID 1 (systemd) lives.
        tree.place(0, nodecg.unit_placement("init.scope"))
        SSH_PROCS.extend(tree.procs_files(nodecg.unit_placement("system.slice/ssh.service")))
    os.chdir("/")
    if persistenced:
        # Before the driver's thread: a fork of a one-threaded process.
        start_persistenced(tree)
    # After the signals are blocked: the driver's thread inherits the mask, so every signal
    # still reaches the loop's sigtimedwait. Its fork()s only ever exec (see spawn).
    smi_driver.serve(smi_driver.SOCKET, smi_state.scan_device_holders)
    uvm_count.serve()
    Init(node_dir, address).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
