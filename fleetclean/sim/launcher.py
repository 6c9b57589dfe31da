"""Start one workload inside a node, detached, and print its PIDs once it is really up.

Runs inside the node (``nsenter -t INIT -p -m -- python3 launcher.py KIND OPTS_JSON``),
standard library only. The workload is double-forked into its own session, so it is
reparented to the node's init and survives the launcher; PIDs are node-namespace PIDs.
Every process of the workload reports through an inherited pipe once its devices are
open, and the launcher prints ``[pid, ...]`` (the workload's root first) only when the
pipe reaches end of file, so a caller never races a half-started workload.

Example: ``launcher.py stubborn '{"gpu": 3}'`` prints ``[41]``: a python3 process that
holds /dev/nvidia3 and ignores SIGTERM. An unknown kind exits 2 with a message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import sys
import termios
import time
from typing import Any

if __package__:
    from fleetclean.sim import nodecg, programs, stuckfs
    from fleetclean.sim.engines import DEFAULT_MODEL, DEFAULT_PORT, ENGINES, binary, longest
else:  # run as a script: the sibling modules are found through sys.path[0]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import programs  # type: ignore[import-not-found,no-redef]
    import stuckfs  # type: ignore[import-not-found,no-redef]
    from engines import DEFAULT_MODEL, DEFAULT_PORT, ENGINES, binary, longest  # type: ignore[import-not-found,no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs.py")
FAKEPKGS = os.path.join(HERE, "fakepkgs")
STUCKFS_PY = os.path.join(HERE, "stuckfs.py")
STUCKFS_LOCK = "/run/fleetclean-stuckfs.lock"
READY_FD = "FLEETCLEAN_SIM_READY_FD"
SYSTEM_PIDS = "/run/fleetclean/system_pids"  # the node dir: the host reads it too
DEFAULT_MIB = {"sglang": 62000, "stubborn": 20480, "slow": 30720, "orphan": 48000,
               "stuck": 20480, "stuck-thread": 20480, "pthread-exit": 20480, "slow-exit": 30720,
               "holder": 24576}
DEFAULT_MIB.update({kind: 62000 for kind in ENGINES})
DEFAULT_MIB_OTHER = 16384
READY_TIMEOUT_S = 30.0
SESSION_SCOPE = "user.slice/user-0.slice/session-1.scope"
# Kinds run by a supervisor inside the node (supervised.py); their option "run" names the
# workload kind they run, "holder" by default.
SYSTEM_UNITS = {"persistenced": "nvidia-persistenced"}  # a system daemon's unit, by kind
SUPERVISED = ("service", "container", "podman", "pod", "tmux", "screen", "slurm-job")


def gpu_list(value: Any) -> list[int]:
    """``"0-7"``, ``"0,2,5"``, ``3`` or ``[1, 2]`` -> GPU indexes."""
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value]
    out: list[int] = []
    for part in str(value).split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.append(int(part))
    return out


def program(spec: dict[str, Any]) -> list[str]:
    text = json.dumps(spec)
    return [sys.executable, PROGRAMS, text.ljust(max(len(text), longest(spec)) + 16)]


def zombie_parent(gpus: list[int]) -> dict[str, Any]:
    """A launcher that never wait()s: its killed workers stay <defunct> while it lives."""
    workers = [
        binary(["python3", "/opt/train/worker.py", "--rank", str(rank)], "python3", [gpu])
        for rank, gpu in enumerate(gpus)
    ]
    argv = ["python3", "/opt/train/launch.py", "--nproc", str(len(gpus))]
    spec: dict[str, Any] = binary(argv, "python3", reap=False, children=workers)
    return spec


def tree_plan(kind: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The tree spec of an engine kind or ``zombie-parent``; ``name`` retitles the root."""
    gpus = gpu_list(opts.get("gpus", "0-7" if kind in ENGINES else "0-1"))
    if kind == "zombie-parent":
        return zombie_parent(gpus)
    model = str(opts.get("model_path", DEFAULT_MODEL))
    tree: dict[str, Any] = ENGINES[kind](gpus, model, int(opts.get("port", DEFAULT_PORT[kind])))
    return tree


def plan(kind: str, opts: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment that start ``kind``; ValueError if unknown."""
    mib = str(opts.get("mib", DEFAULT_MIB.get(kind, DEFAULT_MIB_OTHER)))
    env = {"FLEETCLEAN_SIM_GPU_MIB": mib}
    if kind in ENGINES or kind == "zombie-parent":
        return program(tree_plan(kind, opts)), env
    if kind == "sglang":
        return sglang_argv(opts, env), env
    specs = {**holder_specs(kind, opts), **daemon_specs(opts)}
    if kind not in specs:
        raise ValueError(f"unknown workload kind {kind!r}; known: sglang, {', '.join(specs)}")
    spec = specs[kind]
    name = opts.get("name")
    if name:
        spec.pop("argv", None)
        spec["title"] = str(name)
        spec["comm"] = os.path.basename(str(name).split()[0])
    if opts.get("sees") == "all" and spec.get("gpus"):
        # Every GPU's file open, a context (memory) on its own GPUs only: programs.py.
        spec["sees_all"] = True
        env["FLEETCLEAN_SIM_GPU_CONTEXTS"] = ",".join(str(g) for g in spec["gpus"])
    elif opts.get("sees") not in (None, "own"):
        raise ValueError(f"sees={opts['sees']!r}: 'all' (every GPU's file) or 'own'")
    if kind in ("persistenced", "monitor"):
        # Device handles with no CUDA context: nvidia-smi counts 0 MiB and no app.
        env["FLEETCLEAN_SIM_GPU_MIB"] = "0"
    elif not spec.get("gpus") and kind != "respawn":
        env.pop("FLEETCLEAN_SIM_GPU_MIB")
    return program(spec), env


def sglang_argv(opts: dict[str, Any], env: dict[str, str]) -> list[str]:
    """``python3 -m sglang.launch_server ... --tp N``, run through the fake package."""
    gpus = gpu_list(opts.get("gpus", "0-7"))
    argv = ["-m", "sglang.launch_server"]
    argv += ["--model-path", str(opts.get("model_path", "/models/Kimi-K2.5"))]
    argv += ["--tp", str(len(gpus)), "--port", str(opts.get("port", 30000))]
    argv += ["--trust-remote-code", "--disable-cuda-graph"]
    env.update(
        PYTHONPATH=FAKEPKGS,
        FLEETCLEAN_SIM_GPUS=",".join(map(str, gpus)),
        FLEETCLEAN_SIM_PROGRAMS=PROGRAMS,
    )
    # argv[0] as a user typed it: `ps` and `pkill -f` see "python3 -m sglang...".
    return ["python3", *argv]


def holder_specs(kind: str, opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The single GPU holders: how each reacts to SIGTERM, SIGKILL and its own exit."""
    gpu = int(opts.get("gpu", 3 if kind == "orphan" else 0))
    delay = float(opts.get("delay", 2.0 if kind == "slow" else 5.0))
    return {
        "stubborn": {"role": "holder", "gpus": [gpu], "on_term": "ignore",
                     "title": f"python3 stubborn_worker.py --gpu {gpu}"},
        "slow": {"role": "holder", "gpus": [gpu], "delay": delay,
                 "title": f"python3 slow_worker.py --gpu {gpu}"},
        "orphan": {"role": "holder", "gpus": [gpu], "title": f"sglang::scheduler_TP{gpu}",
                   "comm": f"sglang::scheduler_TP{gpu}", "setproctitle": True},
        # Waits in a driver request (stuckfs's "hang"): state D once killed, survives it.
        "stuck": {"role": "holder", "gpus": [gpu], "driver_wait": "hang",
                  "title": f"python3 stuck_worker.py --gpu {gpu}"},
        # Its driver request waits in a second thread: killed, the main thread is a zombie
        # while that thread stays in state D, holding the GPU.
        "stuck-thread": {"role": "holder", "gpus": [gpu], "driver_wait": "hang-thread",
                         "title": f"python3 stuck_worker.py --gpu {gpu}"},
        # Its main thread calls pthread_exit once ready, a second thread working on: the
        # leader a zombie ("Zl", no command line), the process alive and holding the GPU.
        # thread="driver": that thread waits in the node's stuck driver (state D) instead.
        "pthread-exit": {"role": "holder", "gpus": [gpu], "main_exit": True,
                         "driver_wait": "hang-thread" if opts.get("thread") == "driver"
                         else None,
                         "title": f"python3 thread_worker.py --gpu {gpu}"},
        # Ignores SIGTERM; killed, it spends DELAY in its exit after its GPU is released
        # (stuckfs's flush), longer than a teardown waits after SIGKILL.
        "slow-exit": {"role": "holder", "gpus": [gpu], "on_term": "ignore",
                      "exit_ms": round(delay * 1000),
                      "title": f"python3 exiting_worker.py --gpu {gpu}"},
        "respawn": {"role": "supervisor", "title": "supervise-worker train_worker.py",
                    "comm": "supervise-worker",
                    "child": {"role": "holder", "gpus": [gpu],
                              "delay": float(opts.get("delay", 0.1)),
                              "title": f"python3 train_worker.py --gpu {gpu}"}},
        # A plain GPU job, what the supervisors run by default (sim/supervised.py).
        "holder": {"role": "holder", "gpus": gpu_list(opts.get("gpus", gpu)),
                   "title": "python3 /opt/serve/gpu_worker.py --gpus "
                   + ",".join(map(str, gpu_list(opts.get("gpus", gpu))))},
    }


def daemon_specs(opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The processes that are not workloads: agents, daemons, writers."""
    path = str(opts.get("path", "/dev/shm/sglang_hs"))
    return {
        # Polls NVML, as GPU monitoring agents do: a handle on every GPU, no CUDA context.
        "monitor": {"role": "holder", "nvml": True, "title": "python3 /opt/monitor/agent.py"},
        "persistenced": {
            "role": "persistenced",
            # "all" (the default): every /dev/nvidiaN, as the real daemon; "ctl":
            # nvidiactl only.
            "ctl_only": opts.get("devices", "all") == "ctl",
            # A binary's command line, NUL-separated as the real daemon's: argv[0] is
            # "/usr/bin/nvidia-persistenced" (comm is cut to "nvidia-persiste" by the kernel).
            "title": " ".join(programs.PERSISTENCED_ARGV),
            "argv": programs.PERSISTENCED_ARGV,
            "comm": "nvidia-persistenced",
        },
        "writer": {"role": "writer", "path": os.path.join(path, "hs_000000.bin"),
                   "title": f"python3 hs_writer.py --out {path}"},
    }


def ensure_stuckfs() -> None:
    """Start the node's stuck driver (``stuckfs.py``) unless it runs; one at a time (a
    lock), so that two launchers never mount it twice. Its PID is a system PID of the
    node (left out of ``SimFleet.processes``)."""
    with open(STUCKFS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stuckfs.running():
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                devnull = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.chdir("/")
                os.execv(sys.executable, [sys.executable, STUCKFS_PY, stuckfs.MOUNTPOINT])
            finally:
                os._exit(127)
        os.waitpid(pid, 0)
        if not stuckfs.ready():
            raise TimeoutError("the node's stuck driver (stuckfs) did not come up")
        with open(stuckfs.PID_FILE) as f:
            record_system([int(f.read())])


def record_system(started: list[int]) -> None:
    """Note PIDs that belong to the node itself, not to a workload (see node.processes)."""
    with open(SYSTEM_PIDS, "a") as f:
        f.write("".join(f"{p}\n" for p in started))


def launch(argv: list[str], extra_env: dict[str, str], scope: str = SESSION_SCOPE) -> list[int]:
    """Start the workload in a new session in cgroup ``scope`` and return its PIDs."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            os.close(read_end)
            os.set_inheritable(write_end, True)
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.chdir("/")
            # Started by hand from a login session, as a real node's pam_systemd places it;
            # a system daemon in its own unit. Another account's launcher may not move
            # itself: SimFleet.spawn started it in that user's session scope already.
            if os.geteuid() == 0:
                nodecg.Tree.load().place(0, nodecg.unit_placement(scope))
            env = dict(os.environ, **extra_env)
            env[READY_FD] = str(write_end)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    os.close(write_end)
    os.waitpid(first, 0)
    try:
        return read_ready(read_end)
    finally:
        os.close(read_end)


def read_ready(fd: int) -> list[int]:
    """The PIDs the workload's processes write to ``fd`` (a pipe or FIFO), once every one
    of them has closed it; TimeoutError after READY_TIMEOUT_S."""
    buf = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"workload not ready after {READY_TIMEOUT_S:.0f} s: {buf!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return [int(line) for line in buf.split()]


def start_exec(opts: dict[str, Any]) -> list[int]:
    """Kind ``exec``: the real program ``argv`` (tail, less, vim, a user's script), exec'd
    as a person's command is, in a session of its own, parent the node's init once the
    launcher exits. ``files`` ({path: text}) are written first; ``uid`` runs it as
    another user; ``tty`` gives it a terminal (pagers and editors need one), whose master
    side a holder process keeps open and drains. PIDs: the program, then the holder."""
    argv = [str(a) for a in opts["argv"]]
    for path, text in opts.get("files", {}).items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    uid = int(opts.get("uid", 0))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "xterm", "LANG": "C.UTF-8",
           "HOME": "/root" if uid == 0 else "/tmp"}
    read_end, write_end = os.pipe()  # not inheritable: closed by the exec
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setsid()
            if opts.get("tty"):
                _exec_on_tty(write_end)
            else:
                devnull = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
            if uid:
                os.setgid(uid)
                os.setuid(uid)
            os.chdir(env["HOME"])
            os.write(write_end, f"{os.getpid()}\n".encode())
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(write_end, f"!{argv[0]}: {exc}\n".encode())
        finally:
            os._exit(127)
    os.close(write_end)
    out = b""
    while chunk := os.read(read_end, 4096):
        out += chunk
    if b"!" in out or not out:
        raise RuntimeError(out.decode(errors="replace").strip() or "exec failed")
    program = int(out.split()[0])
    _wait_exec(program, argv[0])
    return [program] if program == pid else [program, pid]


def _wait_exec(pid: int, argv0: str) -> None:
    """Until PID's command line is the new program's. The pipe's end of file comes as the
    exec closes it, a moment before the kernel has set up the new argv: /proc/PID/cmdline
    reads empty meanwhile, and a scan then takes the process for one in its exit."""
    want = argv0.encode() + b"\0"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read(len(want)) == want:
                    return
        except OSError:
            return  # gone: the caller will see it is
        time.sleep(0.002)
    raise TimeoutError(f"pid {pid} did not exec {argv0} within {READY_TIMEOUT_S:.0f} s")


def _exec_on_tty(write_end: int) -> None:
    """Fork: the child (returning) gets a new pty as its controlling terminal; this process
    stays the holder, reading the master side until the child closes it, then exits."""
    master, slave = os.openpty()
    child = os.fork()
    if child:
        os.close(slave)
        os.close(write_end)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        with contextlib.suppress(OSError):
            while os.read(master, 65536):
                pass
        os._exit(0)
    os.close(master)
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.close(slave)


def main(argv: list[str]) -> int:
    kind = argv[1]
    opts: dict[str, Any] = json.loads(argv[2]) if len(argv) > 2 else {}
    if kind == "exec":
        print(json.dumps(start_exec(opts)))
        return 0
    if kind in SUPERVISED:
        if __package__:
            from fleetclean.sim import supervised
        else:
            import supervised  # type: ignore[import-not-found,no-redef]
        try:
            print(json.dumps(supervised.launch(kind, opts)))
        except (ValueError, supervised.SupervisorError) as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    system = bool(opts.pop("system", False))
    try:
        command, env = plan(kind, opts)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if kind in ("stuck", "stuck-thread", "slow-exit") or opts.get("thread") == "driver":
        ensure_stuckfs()
    # Sorted: the workload's root starts first, then its children in rank order.
    scope = f"system.slice/{SYSTEM_UNITS.get(kind, kind)}.service" if system else SESSION_SCOPE
    started = sorted(launch(command, env, scope))
    if system:
        record_system(started)
    print(json.dumps(started))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
