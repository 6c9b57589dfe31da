"""The simulated node's Docker engine: containers with restart policies, as dockerd runs them.

Runs inside a node as the ``docker.service`` unit (``python3 dockerd.py --cgroup-driver
systemd|cgroupfs``, titled ``/usr/bin/dockerd -H fd:// ...``); the ``docker`` CLI
(``dockercli.py``) talks to it on ``/run/docker.sock`` (its own JSON requests, not the
Engine API). Each start is a shim and a container init (``containers.py``) in
``system.slice/docker-ID.scope`` (systemd driver) or ``/docker/ID`` (cgroupfs driver).

Rootless (``--rootless``): a user's own daemon, as ``dockerd-rootless-setuptool.sh
install`` sets it up: the ``docker.service`` unit of that user's service manager, run as
the user, titled ``dockerd``, listening on ``$XDG_RUNTIME_DIR/docker.sock``
(``/run/user/UID/docker.sock``). As under RootlessKit it first makes a user namespace of
its own whose root is the user (the kernel refusing it, it exits with RootlessKit's
words), so its containers' processes are the user's. With the systemd driver (cgroup v2,
the user's manager's subtree delegated) a container is in ``user.slice/user-UID.slice/
user@UID.service/user.slice/docker-ID.scope``, where runc's systemd driver asks the
user's manager for it (moby: cgroup parent ``user.slice`` when rootless); on cgroup v1
(``--cgroup-driver none``, what ``docker info`` says there) it stays in the daemon's own
cgroup. Root's daemon knows none of its containers, as on a real node.

Each request is logged to standard error (the unit's journal) as dockerd ``--debug``
logs the API calls it serves: ``level=debug msg="Calling POST /v1.47/containers/ID/stop?t=10"``.

Restart policies as docker's restart manager applies them: ``always`` and
``unless-stopped`` restart whatever the exit, ``on-failure[:N]`` after a non-zero exit (at
most N times), ``no`` never; after 100 ms, doubling while the container keeps dying within
10 s, at most a minute. ``docker stop`` and ``docker kill`` mark the container stopped by
hand: it is not restarted (moby's killWithSignal: ExitOnNext, HasBeenManuallyStopped). A
signal sent to its process by anyone else is a crash: it is restarted.

``docker exec`` (``exec``): the daemon checks that the container runs and answers with the
process to start (the container's environment with ``-e`` on top, a bare ``KEY`` unsetting
KEY; the working directory ``-w``, else ``/``) and the socket of the container's shim,
which starts it beside the init (``containers.py``). Nothing restarts such a process.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import random
import signal
import sys
import time
from typing import Any

if __package__:
    from fleetclean.sim import containers, daemonkit, nodecg
    from fleetclean.sim.proctitle import set_plain_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title  # type: ignore[import-not-found,no-redef]

SOCKET = "/run/docker.sock"
TITLE = "/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock"
ROOTLESS_TITLE = "dockerd"  # as dockerd-rootless.sh execs it
API = "/v1.47"
CLONE_NEWUSER = 0x10000000
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ADJECTIVES = ("admiring", "bold", "eager", "focused", "gifted", "jolly", "quirky", "vibrant")
_NAMES = ("curie", "hopper", "lovelace", "noether", "ritchie", "shannon", "turing", "wozniak")


class Container:
    """One container and its state (docker inspect's State)."""

    def __init__(self, cid: str, name: str, env: dict[str, str], req: dict[str, Any]) -> None:
        self.id, self.name, self.env = cid, name, env
        self.image = str(req.get("image", "ubuntu:22.04"))
        self.argv, self.labels = list(req["argv"]), dict(req.get("labels", {}))
        # What docker run was given (Path, Args, Cmd), not the simulator's own program.
        self.command = list(req.get("command") or []) or self.argv
        policy, _, retries = str(req.get("restart", "no")).partition(":")
        self.policy, self.max_retries = policy or "no", int(retries or 0)
        self.status = "created"
        self.pid = self.exit_code = self.restart_count = self.failures = 0
        self.created = time.time()
        self.started_at = self.finished_at = 0.0
        self.manual = False
        self.waiters: list[daemonkit.Reply] = []
        self.timer: int | None = None
        self.shim_socket = ""

    def inspect(self, driver: str) -> dict[str, Any]:
        """The part of docker inspect's JSON fleetclean and people read."""
        image_id = "sha256:" + hashlib.sha256(self.image.encode()).hexdigest()
        env = [f"{k}={v}" for k, v in self.env.items()]
        return {
            "Id": self.id,
            "Created": containers.iso(self.created),
            "Path": self.command[0],
            "Args": self.command[1:],
            "State": {
                "Status": self.status,
                "Running": self.status in ("running", "restarting"),
                "Paused": False,
                "Restarting": self.status == "restarting",
                "OOMKilled": False,
                "Dead": False,
                "Pid": self.pid if self.status == "running" else 0,
                "ExitCode": self.exit_code,
                "Error": "",
                "StartedAt": containers.iso(self.started_at),
                "FinishedAt": containers.iso(self.finished_at),
            },
            "Image": image_id,
            "Name": "/" + self.name,
            "RestartCount": self.restart_count,
            "Driver": "overlay2",
            "Platform": "linux",
            "HostConfig": {
                "RestartPolicy": {"Name": self.policy, "MaximumRetryCount": self.max_retries},
                "CgroupParent": "",
                # Its own PID namespace (the simulator has no --pid=host): docker's "".
                "PidMode": "",
                "Runtime": "runc",
            },
            "Config": {
                "Hostname": self.id[:12],
                "Env": env,
                "Cmd": self.command,
                "Image": self.image,
                "Entrypoint": None,
                "Labels": self.labels,
            },
            "CgroupDriver": driver,
        }

    def ps_row(self) -> dict[str, Any]:
        now = time.time()
        status = containers.ps_status(self.status, self.exit_code, self.started_at,
                                      self.finished_at, now)
        return {
            "ID": self.id,
            "Image": self.image,
            "Command": " ".join(self.command),
            "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(self.created)),
            "RunningFor": containers.human_duration(now - self.created) + " ago",
            "Ports": "",
            "State": self.status,
            "Status": status,
            "Names": self.name,
            "Labels": self.labels,
        }


def rootless_socket(uid: int) -> str:
    """Where user ``uid``'s rootless daemon listens: ``$XDG_RUNTIME_DIR/docker.sock``."""
    return f"/run/user/{uid}/docker.sock"


class Engine:
    """The daemon's state and its answers to the CLI; ``rootless_uid`` is the user whose
    rootless daemon it is (None: root's)."""

    def __init__(self, loop: daemonkit.Loop, driver: str,
                 rootless_uid: int | None = None) -> None:
        self.loop, self.driver, self.rootless_uid = loop, driver, rootless_uid
        self.tree = nodecg.Tree.load()
        self.containers: dict[str, Container] = {}
        # A rootless daemon's containerd keeps its sockets in the user's runtime dir.
        self.containerd = containers.CONTAINERD_SOCK
        self.shim_dir = containers.SHIM_SOCKETS
        if rootless_uid is not None:
            run = os.path.dirname(rootless_socket(rootless_uid))
            self.containerd = f"{run}/docker/containerd/containerd.sock"
            self.shim_dir = f"{run}/docker/containerd/s"

    def cgroup(self, c: Container) -> str:
        """The container's cgroup, "" where it has none of its own (driver none)."""
        if self.driver == "none":
            return ""
        if self.rootless_uid is not None:
            uid = self.rootless_uid
            return f"user.slice/user-{uid}.slice/user@{uid}.service/user.slice/docker-{c.id}.scope"
        if self.driver == "systemd":
            return f"system.slice/docker-{c.id}.scope"
        return f"docker/{c.id}"

    def find(self, ref: str) -> Container | None:
        """By id, unique id prefix, or name (with or without its leading slash)."""
        ref = ref.lstrip("/")
        if ref in self.containers:
            return self.containers[ref]
        by_name = [c for c in self.containers.values() if c.name == ref]
        if by_name:
            return by_name[0]
        prefixed = [c for c in self.containers.values() if c.id.startswith(ref)]
        return prefixed[0] if len(prefixed) == 1 and len(ref) >= 1 else None

    def handle(self, req: dict[str, Any], reply: daemonkit.Reply) -> None:
        for call in api_calls(req):
            log_call(call)
        op = req.get("op")
        if op == "run":
            reply(self.run(req))
        elif op == "ps":
            shown = [c for c in self.containers.values()
                     if req.get("all") or c.status in ("running", "restarting")]
            shown.sort(key=lambda c: -c.created)
            reply({"ok": True, "containers": [c.ps_row() for c in shown]})
        elif op == "inspect":
            found = [self.find(r) for r in req.get("refs", [])]
            reply({"ok": True, "objects": [c.inspect(self.driver) if c else None for c in found]})
        elif op == "info":
            security = ["name=seccomp,profile=builtin"]
            if self.rootless_uid is not None:
                security += ["name=rootless", "name=cgroupns"]
            reply({"ok": True, "CgroupDriver": self.driver, "Containers": len(self.containers),
                   "SecurityOptions": security})
        elif op in ("stop", "kill"):
            self.stop_or_kill(op, req, reply)
        elif op == "exec":
            reply(self.exec(req))
        else:
            reply({"error": f"unknown operation {op!r}", "status": 400})

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("name") or f"{random.choice(_ADJECTIVES)}_{random.choice(_NAMES)}")
        taken = self.find(name)
        if taken is not None and taken.name == name:
            return {"error": f'Conflict. The container name "/{name}" is already in use by '
                    f'container "{taken.id}". You have to remove (or rename) that container '
                    "to be able to reuse that name.", "status": 409}
        cid = containers.new_id()
        env = {"PATH": CONTAINER_PATH, "HOSTNAME": cid[:12], "HOME": "/root", **req.get("env", {})}
        c = Container(cid, name, env, req)
        self.containers[cid] = c
        log_call(f"POST {API}/containers/{cid}/start")
        self._start(c)
        return {"ok": True, "id": cid}

    def _start(self, c: Container) -> None:
        c.timer = None
        title = f"/usr/bin/containerd-shim-runc-v2 -namespace moby -id {c.id} -address " \
                f"{self.containerd}"
        c.shim_socket = containers.shim_socket("moby", c.id, self.containerd, self.shim_dir)
        _, c.pid = containers.start(self.loop, argv=c.argv, env=c.env, cgroup=self.cgroup(c),
                                    shim_title=title, on_exit=lambda code: self._exited(c, code),
                                    exec_socket=c.shim_socket)
        c.status, c.started_at = "running", time.time()

    def _exited(self, c: Container, code: int) -> None:
        now = time.time()
        ran = now - c.started_at
        c.status, c.exit_code, c.finished_at, c.pid = "exited", code, now, 0
        if self.cgroup(c):
            self.tree.remove(self.cgroup(c))
        waiters, c.waiters = c.waiters, []
        for reply in waiters:
            reply({"ok": True})
        if c.manual or not self._restarts(c, code):
            return
        c.failures = 0 if ran >= 10 else c.failures + 1
        c.status = "restarting"
        c.timer = self.loop.after(containers.backoff(max(0, c.failures - 1)),
                                  lambda: self._restart(c))

    def _restarts(self, c: Container, code: int) -> bool:
        if c.policy in ("always", "unless-stopped"):
            return True
        if c.policy == "on-failure":
            return code != 0 and (c.max_retries == 0 or c.restart_count < c.max_retries)
        return False

    def _restart(self, c: Container) -> None:
        if c.status != "restarting" or c.manual:
            return
        c.restart_count += 1
        self._start(c)

    def exec(self, req: dict[str, Any]) -> dict[str, Any]:
        """What ``docker exec`` starts and where, or moby's refusal (exec create)."""
        ref = str(req.get("ref", ""))
        c = self.find(ref)
        if c is None:
            return {"error": f"No such container: {ref}", "status": 404}
        if c.status == "restarting":
            return {"error": f"Container {c.id} is restarting, wait until the container is "
                    "running", "status": 409}
        if c.status != "running":
            return {"error": f"Container {c.id} is not running", "status": 409}
        env = {**c.env}
        for item in req.get("env", []):
            key, has_value, value = str(item).partition("=")
            if has_value:
                env[key] = value
            else:
                env.pop(key, None)
        return {"ok": True, "socket": c.shim_socket, "cwd": str(req.get("workdir") or "/"),
                "env": [f"{k}={v}" for k, v in env.items()]}

    def stop_or_kill(self, op: str, req: dict[str, Any], reply: daemonkit.Reply) -> None:
        ref = str(req.get("ref", ""))
        c = self.find(ref)
        if c is None:
            reply({"error": f"No such container: {ref}", "status": 404})
            return
        if c.status == "restarting":
            # moby: a restarting container counts as running; stop or kill only tell its
            # restart manager to give up (ExitOnNext), and both succeed.
            self.loop.cancel(c.timer)
            c.manual, c.status = True, "exited"
            reply({"ok": True})
            return
        if c.status != "running":
            if op == "kill":
                reply({"error": f"cannot kill container: {ref}: container {c.id} is not running",
                       "status": 409})
            else:
                reply({"ok": True})
            return
        c.manual = True
        c.waiters.append(reply)
        pid = c.pid
        sig = int(req.get("signal") or signal.SIGKILL) if op == "kill" else signal.SIGTERM
        nodecg.signal_all([pid], sig)
        if op == "stop":
            grace = float(req.get("t", 10))
            self.loop.after(grace, lambda: self._kill_if_running(c, pid))
        elif sig != signal.SIGKILL:
            c.waiters.remove(reply)
            reply({"ok": True})


    def _kill_if_running(self, c: Container, pid: int) -> None:
        if c.status == "running" and c.pid == pid:
            nodecg.signal_all([pid], signal.SIGKILL)


def api_calls(req: dict[str, Any]) -> list[str]:
    """The Engine API calls a request stands for, as dockerd's debug log names them.

    >>> api_calls({"op": "stop", "ref": "3f2a", "t": 1})
    ['POST /v1.47/containers/3f2a/stop?t=1']
    >>> api_calls({"op": "inspect", "refs": ["a", "b"]})
    ['GET /v1.47/containers/a/json', 'GET /v1.47/containers/b/json']
    """
    op, ref = req.get("op"), req.get("ref", "")
    if op == "inspect":
        return [f"GET {API}/containers/{r}/json" for r in req.get("refs", [])]
    calls = {
        "run": [f"POST {API}/containers/create"],  # then its start: Engine.run
        "ps": [f"GET {API}/containers/json"],
        "info": [f"GET {API}/info"],
        "stop": [f"POST {API}/containers/{ref}/stop?t={req.get('t', 10)}"],
        "kill": [f"POST {API}/containers/{ref}/kill?signal={req.get('signal') or 'KILL'}"],
        "exec": [f"POST {API}/containers/{ref}/exec"],
    }
    return calls.get(str(op), [f"{op} (unknown)"])


def log_call(call: str) -> None:
    print(f'time="{containers.iso(time.time())}" level=debug msg="Calling {call}"',
          file=sys.stderr, flush=True)


def enter_user_namespace(uid: int, gid: int) -> None:
    """Become root of a user namespace of our own, mapped to ``uid`` and ``gid``, as
    RootlessKit makes one for a rootless dockerd (it maps the user's subordinate ids too,
    with newuidmap; the simulator's containers run as their root only). OSError where the
    kernel refuses an unprivileged user namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                       ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dockerd")
    parser.add_argument("--cgroup-driver", choices=("systemd", "cgroupfs", "none"),
                        default="cgroupfs")
    parser.add_argument("--rootless", action="store_true",
                        help="the user's own daemon (run as that user, by their manager)")
    # Only room in the argv area for the title set below (see proctitle.set_plain_title).
    parser.add_argument("--title-room", default="")
    args = parser.parse_args(argv)
    uid = None
    if args.rootless:
        uid = os.getuid()
        try:
            enter_user_namespace(uid, os.getgid())
        except OSError as exc:
            why = (exc.strerror or str(exc)).lower()
            print(f"[rootlesskit:parent] error: failed to start the child: fork/exec "
                  f"/proc/self/exe: {why}", file=sys.stderr, flush=True)
            return 1
    set_plain_title(ROOTLESS_TITLE if args.rootless else TITLE, "dockerd")
    loop = daemonkit.Loop()
    engine = Engine(loop, args.cgroup_driver, uid)
    loop.serve(SOCKET if uid is None else rootless_socket(uid), engine.handle)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
