"""Workloads that a supervisor runs inside a node: a systemd unit, a docker container, a
Kubernetes pod, a tmux or screen session, a Slurm job. Part of ``launcher.py`` (node side,
standard library only).

``launch(kind, opts)`` starts the supervisor when the node has none yet (the service
manager, then ``docker.service`` or ``kubelet.service`` under it: a node with none costs
nothing), installs its command-line tool in ``/usr/local/sbin``, hands it the workload
``opts["run"]`` (any plain kind, ``holder`` by default, with its own options), and returns
the workload's PIDs once every process of it holds its devices: they report on a FIFO
whose path travels in the environment, as the supervisor passes it on.

Options per kind (all optional): ``service``: ``unit``, ``restart`` (``always``),
``restart_sec``, ``kill_mode``, ``timeout_stop``, ``user`` (a UID: a user service);
``container``: ``container`` (its name), ``image``, ``restart`` (``no``), ``driver``
(``systemd``/``cgroupfs``), ``rootless`` (an account: run by that user's rootless daemon,
the ``docker.service`` of their service manager, on ``/run/user/UID/docker.sock``; its
driver ``systemd`` on cgroup v2, ``none`` elsewhere); ``pod``: ``pod``, ``namespace``,
``container``, ``image``, ``qos`` (``besteffort``, ``burstable``, ``guaranteed``),
``restart_policy`` (``Always``), ``driver``; ``podman``: ``container``, ``image``,
``restart`` (``no``), ``driver`` (podman's cgroup manager: ``systemd``/``cgroupfs``),
``rootless`` (an account: run by that user's own podman, from a scope of their manager's
``user.slice``, as podman moves itself there), ``unit`` (root's podman run by that
oneshot unit, ``RemainAfterExit=yes``, as podman-restart.service starts containers at
boot: podman leaves conmon in the unit's cgroup);
``tmux``/``screen``: ``session``; ``slurm-job``: ``slurm_conf``, ``node``, ``job_name``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if __package__:
    from fleetclean.sim import (
        daemonkit,
        dockerd,
        kubelet,
        launcher,
        nodecg,
        svcmgr,
        unitfile,
        unitstate,
    )
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import dockerd  # type: ignore[import-not-found,no-redef]
    import kubelet  # type: ignore[import-not-found,no-redef]
    import launcher  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import svcmgr  # type: ignore[import-not-found,no-redef]
    import unitfile  # type: ignore[import-not-found,no-redef]
    import unitstate  # type: ignore[import-not-found,no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
# This package as every account of the node can read it (layout.IN_NODE_CODE): a user's
# own daemon runs it from there.
SHARED_CODE = "/run/fleetclean-code"
BIN = "/usr/local/sbin"  # the node's own bin dir (node.py binds it there)
READY_PATH = "FLEETCLEAN_SIM_READY_PATH"
# The options of the workload itself; every other option is the supervisor's.
WORKLOAD_KEYS = ("gpu", "gpus", "mib", "name", "delay", "model_path", "port", "path", "devices")
IMAGES = {"vllm": "vllm/vllm-openai:v0.6.3", "sglang": "lmsysorg/sglang:v0.4.1-cu124",
          "tgi": "ghcr.io/huggingface/text-generation-inference:2.4.0",
          "triton": "nvcr.io/nvidia/tritonserver:24.08-py3"}
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
# Room in a daemon's argv area for the title it takes (dockerd's, the kubelet's are long).
TITLE_ROOM = "x" * 40


class SupervisorError(Exception):
    """A supervisor refused the workload (a name in use, a missing tool...)."""


def launch(kind: str, opts: dict[str, Any]) -> list[int]:
    """Start workload ``opts["run"]`` under supervisor ``kind``; its node PIDs, sorted."""
    run = str(opts.get("run", "holder"))
    if run in launcher.SUPERVISED:
        raise ValueError(f"{kind} cannot run {run!r}: name a plain workload kind")
    argv, env = launcher.plan(run, {k: v for k, v in opts.items() if k in WORKLOAD_KEYS})
    if "/" not in argv[0]:
        argv = [shutil.which(argv[0]) or sys.executable, *argv[1:]]
    opts = {**opts, "run": run, "command": _shown(argv)}
    starters: dict[str, Callable[[list[str], dict[str, str], dict[str, Any]], None]] = {
        "service": service, "container": container, "podman": podman, "pod": pod,
        "tmux": tmux,
        "screen": screen, "slurm-job": slurm_job,
    }
    fifo_dir = tempfile.mkdtemp(prefix="ready-", dir="/run/fleetclean")
    fifo = os.path.join(fifo_dir, "fifo")
    os.mkfifo(fifo, 0o622)
    # Another user's workload (a rootless container's) reports there too; the umask took
    # the FIFO's write bits for others.
    os.chmod(fifo_dir, 0o711)
    os.chmod(fifo, 0o622)
    try:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            starters[kind](argv, {**env, READY_PATH: fifo}, opts)
            return sorted(launcher.read_ready(reader))
        finally:
            os.close(reader)
    finally:
        shutil.rmtree(fifo_dir, ignore_errors=True)


def _shown(argv: list[str]) -> list[str]:
    """The command a person would have given the supervisor: the title the simulator's
    program takes (``python3 -m vllm.entrypoints...``) rather than ``programs.py SPEC``."""
    if len(argv) > 2 and argv[1].endswith("programs.py"):
        spec = json.loads(argv[2])
        return [str(a) for a in spec.get("argv") or str(spec.get("title", "")).split()]
    return argv


def install_cli(name: str, script: str, code: str = HERE) -> None:
    """``/usr/local/sbin/NAME`` running our ``script`` (from ``code``: SHARED_CODE for a
    tool every account runs), as the package would install it."""
    path = os.path.join(BIN, name)
    text = f'#!/bin/sh\nexec {sys.executable} -S -E {os.path.join(code, script)} "$@"\n'
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        if f.read() == text:
            return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


# ------------------------------------------------------------------------- systemd


def write_unit(name: str, uid: int | None, argv: list[str], env: dict[str, str],
               settings: dict[str, str]) -> None:
    lines = ["[Unit]", f"Description={name} (fleetclean simulator)", "", "[Service]",
             "Type=simple", f"ExecStart={unitfile.quote(argv)}"]
    if env:
        lines.append("Environment=" + unitfile.quote([f"{k}={v}" for k, v in env.items()]))
    lines += [f"{k}={v}" for k, v in settings.items()]
    folder = svcmgr.UNIT_DIRS["system" if uid is None else "user"]
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, "." + name)
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(folder, name))


def start_unit(name: str, uid: int | None = None) -> None:
    daemonkit.call(svcmgr.SOCKET, {"op": "daemon-reload"})
    answer = daemonkit.call(svcmgr.SOCKET, {"op": "start", "unit": name, "uid": uid})
    if "error" in answer:
        raise SupervisorError(f"systemctl start {name}: {answer['error']}")


def service(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    svcmgr.ensure()
    install_cli("systemctl", "systemctl.py")
    default = {"holder": "gpu-worker"}.get(opts["run"], opts["run"])
    name = str(opts.get("unit") or default)
    name = name if name.endswith(".service") else name + ".service"
    uid = None if opts.get("uid") is None else int(opts["uid"])
    settings = {"Restart": str(opts.get("restart", "always"))}
    keys = {"restart_sec": "RestartSec", "kill_mode": "KillMode", "timeout_stop": "TimeoutStopSec"}
    settings.update({unit_key: str(opts[k]) for k, unit_key in keys.items() if k in opts})
    write_unit(name, uid, argv, env, settings)
    start_unit(name, uid)


def _default_driver(opts: dict[str, Any]) -> str:
    """What a node of this cgroup mode most often runs: systemd's driver on cgroup v2,
    cgroupfs (docker's default) on v1."""
    driver = opts.get("driver")
    if driver:
        return str(driver)
    return "systemd" if nodecg.Tree.load().mode == "v2" else "cgroupfs"


def _running_driver(socket_path: str) -> str | None:
    """The cgroup driver of the runtime answering on ``socket_path`` (None: none answers),
    the node's service manager and its systemctl made ready for a start."""
    svcmgr.ensure()
    install_cli("systemctl", "systemctl.py")
    try:
        driver = daemonkit.call(socket_path, {"op": "info"}).get("CgroupDriver")
    except daemonkit.Unavailable:
        return None
    return None if driver is None else str(driver)


def ensure_daemon(unit: str, script: str, socket_path: str, driver: str) -> None:
    """The runtime's unit started (once) with the cgroup driver asked for; a runtime
    already running with another driver is an error, as one dockerd has one driver."""
    running = _running_driver(socket_path)
    if running is None:
        argv = [sys.executable, "-S", "-E", os.path.join(HERE, script),
                f"--cgroup-driver={driver}", f"--title-room={TITLE_ROOM}"]
        write_unit(unit, None, argv, {}, {"Restart": "always", "RestartSec": "2",
                                           "KillMode": "process"})
        start_unit(unit)
        daemonkit.wait_socket(socket_path)
    elif running != driver:
        raise SupervisorError(f"{unit} runs with the {running} cgroup driver, not {driver}")


def container(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    if opts.get("rootless") is not None:
        sock = ensure_rootless_daemon(str(opts["rootless"]), opts.get("driver"))
    else:
        ensure_daemon("docker.service", "dockerd.py", dockerd.SOCKET, _default_driver(opts))
        sock = dockerd.SOCKET
    install_cli("docker", "dockercli.py")
    request = {"op": "run", "argv": argv, "env": env, "name": opts.get("container", ""),
               "command": opts["command"],
               "image": opts.get("image") or IMAGES.get(opts["run"], DEFAULT_IMAGE),
               "restart": str(opts.get("restart", "no")), "labels": opts.get("labels", {})}
    answer = daemonkit.call(sock, request)
    if "error" in answer:
        raise SupervisorError(f"docker run: {answer['error']}")


def ensure_rootless_daemon(user: str, driver: Any) -> str:
    """``user``'s rootless dockerd started (once): the ``docker.service`` unit of their
    service manager, as ``dockerd-rootless-setuptool.sh install`` and ``systemctl --user
    start docker`` leave it; its socket. Its cgroup driver is systemd's on cgroup v2 (the
    user's manager's subtree delegated to them), none elsewhere, as ``docker info`` says."""
    entry = _account(user, "rootless docker")
    usable = "systemd" if nodecg.Tree.load().mode == "v2" else "none"
    if driver and driver != usable:
        raise SupervisorError(f"rootless docker here has the {usable} cgroup driver, "
                              f"not {driver}")
    uid, sock = entry.pw_uid, dockerd.rootless_socket(entry.pw_uid)
    if _running_driver(sock) is None:
        argv = [sys.executable, "-S", "-E", os.path.join(SHARED_CODE, "dockerd.py"),
                "--rootless", f"--cgroup-driver={usable}", f"--title-room={TITLE_ROOM}"]
        write_unit("docker.service", uid, argv, {}, {"Restart": "always", "RestartSec": "2",
                                                     "KillMode": "process"})
        start_unit("docker.service", uid)
        _wait_rootless(sock, uid)
    return sock


def _wait_rootless(sock: str, uid: int, timeout: float = 10.0) -> None:
    """Until the user's daemon answers; SupervisorError, with what it said, where it
    exited instead (a kernel that refuses it a user namespace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            daemonkit.call(sock, {"op": "info"}, timeout=5)
            return
        except daemonkit.Unavailable:
            pass
        props = dict(daemonkit.call(svcmgr.SOCKET, {"op": "show", "unit": "docker.service",
                                                    "uid": uid})["props"])
        if props.get("ActiveState") != "active":
            daemonkit.call(svcmgr.SOCKET, {"op": "stop", "unit": "docker.service", "uid": uid})
            raise SupervisorError(f"systemctl --user start docker (uid {uid}): "
                                  f"{_journal_tail(uid) or 'the daemon exited'}")
        time.sleep(0.01)
    raise SupervisorError(f"rootless docker of uid {uid}: nothing listens on {sock} "
                          f"after {timeout:.0f} s")


def _journal_tail(uid: int) -> str:
    path = os.path.join(unitstate.JOURNAL, f"user@{uid}.service", "docker.service.log")
    with contextlib.suppress(OSError), open(path) as f:
        lines = [line.strip() for line in f if line.strip()]
        return lines[-1] if lines else ""
    return ""


def podman(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    """``podman run -d`` by root, or by the ``rootless`` user (their runtime dir made and
    their manager's cgroup delegated to them, as logind and systemd leave them; the podman
    process in a scope of their manager's user.slice, where podman asks systemd to move
    it, so that its conmon and container may go beside it)."""
    install_cli("podman", "podmancli.py", SHARED_CODE)
    manager = str(opts.get("driver") or "systemd")
    command = [os.path.join(BIN, "podman"), "--cgroup-manager", manager, "run", "-d",
               "--restart", str(opts.get("restart", "no")),
               "--name", str(opts.get("container") or opts["run"])]
    command += [f"--env={k}={v}" for k, v in env.items()]
    command += [opts.get("image") or IMAGES.get(opts["run"], DEFAULT_IMAGE), *argv]
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    preexec: Callable[[], None] | None = None
    if opts.get("unit") and opts.get("rootless") is None:
        # A unit's process: systemd sets INVOCATION_ID, so podman leaves conmon there.
        svcmgr.ensure()
        install_cli("systemctl", "systemctl.py")
        unit = str(opts["unit"])
        write_unit(unit, None, command, {}, {"Type": "oneshot", "RemainAfterExit": "yes"})
        start_unit(unit)
        return
    if opts.get("rootless") is not None:
        entry = _account(str(opts["rootless"]), "rootless podman")
        uid, gid = entry.pw_uid, entry.pw_gid
        tree = nodecg.Tree.load()
        manager_cg = unitstate.manager_cgroup(uid)
        if manager == "cgroupfs" or not (tree.delegate(manager_cg, uid, gid) and
                                         tree.delegate(f"{manager_cg}/user.slice", uid, gid)):
            raise SupervisorError("rootless podman here needs cgroup v2 and the systemd "
                                  f"cgroup manager (this node: {tree.mode}, {manager})")
        run_env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name,
                       XDG_RUNTIME_DIR=unitstate.runtime_dir(uid, gid))

        def preexec() -> None:
            scope = f"{manager_cg}/user.slice/podman-{os.getpid()}.scope"
            tree.place(0, nodecg.everywhere(scope))
            os.setgid(gid)
            os.initgroups(entry.pw_name, gid)
            os.setuid(uid)

    done = subprocess.run(command, env=run_env, capture_output=True, text=True, cwd="/",
                          preexec_fn=preexec, check=False)
    if done.returncode != 0:
        raise SupervisorError(f"podman run: {done.stderr.strip()}")


def _account(user: str, what: str) -> pwd.struct_passwd:
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError as exc:
        raise SupervisorError(f"{what}: no account {user!r} on this node") from exc
    if entry.pw_uid == 0:
        raise SupervisorError(f"{what} runs as a user other than root")
    return entry


def pod(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    ensure_daemon("kubelet.service", "kubelet.py", kubelet.SOCKET, _default_driver(opts))
    install_cli("crictl", "crictl.py")
    name = str(opts.get("pod") or f"{opts['run']}-0")
    spec = {"name": str(opts.get("container") or opts["run"]), "argv": argv, "env": env,
            "image": opts.get("image") or IMAGES.get(opts["run"], DEFAULT_IMAGE)}
    request = {"op": "run_pod", "name": name, "namespace": opts.get("namespace", "default"),
               "qos": opts.get("qos", "besteffort"),
               "restart_policy": opts.get("restart_policy", "Always"), "containers": [spec]}
    answer = daemonkit.call(kubelet.SOCKET, request)
    if "error" in answer:
        raise SupervisorError(f"run pod {name}: {answer['error']}")


# ------------------------------------------------------------------------- sessions, jobs


def _shell_command(argv: list[str], env: dict[str, str]) -> str:
    exports = " ".join(f"{k}={_sh(v)}" for k, v in env.items())
    return f"export {exports}; exec {' '.join(_sh(a) for a in argv)}"


def _sh(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SupervisorError(f"{name} is not installed here (scripts/dev setup installs it)")
    return path


def _session_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root", "TERM": "xterm",
            "LANG": "C.UTF-8", "SHELL": "/bin/sh"}


def _in_session() -> None:
    # tmux and screen started by hand from a login session.
    nodecg.Tree.load().place(0, nodecg.unit_placement(launcher.SESSION_SCOPE))


def tmux(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    session = str(opts.get("session", "train"))
    command = [_tool("tmux"), "new-session", "-d", "-s", session, "-x", "200", "-y", "50",
               _shell_command(argv, env)]
    done = subprocess.run(command, env=_session_env(), capture_output=True, text=True,
                          preexec_fn=_in_session, check=False)
    if done.returncode != 0:
        raise SupervisorError(f"tmux new-session: {done.stderr.strip()}")


def screen(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    session = str(opts.get("session", "train"))
    screendir = "/run/screen"
    os.makedirs(screendir, mode=0o700, exist_ok=True)
    os.chmod(screendir, 0o700)
    command = [_tool("screen"), "-dmS", session, "/bin/sh", "-c", _shell_command(argv, env)]
    done = subprocess.run(command, env={**_session_env(), "SCREENDIR": screendir},
                          capture_output=True, text=True, preexec_fn=_in_session, check=False)
    if done.returncode != 0:
        raise SupervisorError(f"screen -dmS: {done.stderr.strip() or done.stdout.strip()}")


def slurm_job(argv: list[str], env: dict[str, str], opts: dict[str, Any]) -> None:
    conf = opts.get("slurm_conf")
    if not conf:
        raise SupervisorError("this fleet has no Slurm (sim up --slurm)")
    with open("/run/fleetclean/gpus.json") as f:
        node = str(opts.get("node") or json.load(f)["name"])
    gpus = len(launcher.gpu_list(opts.get("gpus", opts.get("gpu", 0))))
    command = [_tool("sbatch"), "--parsable", "-w", node, f"--gres=gpu:{gpus}", "-o", "/dev/null",
               "-J", str(opts.get("job_name", opts["run"])), "--wrap", _shell_command(argv, env)]
    done = subprocess.run(command, env={**_session_env(), "SLURM_CONF": str(conf)},
                          capture_output=True, text=True, cwd="/", check=False)
    if done.returncode != 0:
        raise SupervisorError(f"sbatch: {done.stderr.strip()}")
