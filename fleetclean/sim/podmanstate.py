"""A simulated node's Podman containers, as each user's ``podman`` finds them: no daemon,
one store per user (``podmancli.py`` reads and writes it, ``conmon.py`` runs each one).

Runs inside a node (standard library only, a sibling module). Where real Podman keeps a
database in its graph root, this keeps one JSON file in the run root, under a lock, since
the node's /var/lib is this machine's: root's in ``/run/containers/storage``, a rootless
user's in ``$XDG_RUNTIME_DIR/containers`` (their runtime dir, ``/run/user/UID``). Root's
podman therefore knows none of a user's containers, and a user's none of root's or another
user's, as on a real node.

Where things are, as podman lays them out (``podman info``): the run root holds each
container's ``overlay-containers/ID/userdata`` (its bundle's ``config.json`` and conmon's
pidfile); the tmp dir (root's ``/run/libpod``, a user's ``$XDG_RUNTIME_DIR/libpod/tmp``)
holds ``exits/ID``, the exit code conmon writes, and ``persist/ID``.

Cgroups, with the systemd cgroup manager: the container in ``machine.slice/libpod-ID.scope``
(a rootless one under its user's manager, ``user.slice/user-UID.slice/user@UID.service/
user.slice/libpod-ID.scope``) and its conmon beside it in ``libpod-conmon-ID.scope``; with
cgroupfs, ``/libpod_parent/libpod-ID`` and ``/libpod_parent/conmon``.

>>> s = Store(Where(0, "/run"))
>>> c = Ctr.new({"name": "llm", "argv": ["/bin/true"], "image": "x", "restart": "always"})
>>> s.cgroup(c, "systemd").startswith("machine.slice/libpod-" + c.id)
True
>>> Store(Where(1000, "/run/user/1000")).conmon_cgroup(c, "systemd").split("/")[3:5] == [
...     "user.slice", f"libpod-conmon-{c.id}.scope"]
True
>>> c.policy, c.retries, Ctr.new({"argv": ["x"], "restart": "on-failure:3"}).retries
('always', 0, 3)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

if __package__:
    from fleetclean.sim import containers
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]

ROOTLESS_UID = "_CONTAINERS_ROOTLESS_UID"  # podman's own mark of its rootless re-exec
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NAMES = ("admiring_curie", "bold_hopper", "eager_noether", "jolly_turing", "quirky_shannon")


@dataclass(frozen=True)
class Where:
    """Whose store: ``uid`` (0: root's) and the runtime dir of a rootless user."""

    uid: int
    run: str

    @classmethod
    def mine(cls, environ: dict[str, str]) -> Where:
        """This podman's: the rootless user podman re-exec'd for (conmon's exit command
        runs as root of the user's namespace), else the caller's; a rootless one's runtime
        dir is ``XDG_RUNTIME_DIR``, else ``/run/user/UID``, as podman's
        GetRootlessRuntimeDir."""
        uid = int(environ.get(ROOTLESS_UID) or os.geteuid())
        return cls(uid, environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}")

    @property
    def runroot(self) -> str:
        return "/run/containers/storage" if self.uid == 0 else f"{self.run}/containers"

    @property
    def tmpdir(self) -> str:
        return "/run/libpod" if self.uid == 0 else f"{self.run}/libpod/tmp"


@dataclass
class Ctr:
    """One container, its config and state (``podman inspect``'s)."""

    id: str
    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    policy: str = "no"
    retries: int = 0
    status: str = "created"
    pid: int = 0
    conmon_pid: int = 0
    exit_code: int = 0
    restart_count: int = 0
    stopped_by_user: bool = False
    created: float = field(default_factory=time.time)
    started_at: float = 0.0
    finished_at: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def new(cls, req: dict[str, Any]) -> Ctr:
        policy, _, retries = str(req.get("restart") or "no").partition(":")
        cid = containers.new_id()
        env = {"PATH": PATH, "container": "podman", "HOSTNAME": cid[:12], "HOME": "/root"}
        env.update(req.get("env") or {})
        return cls(id=cid, name=str(req.get("name") or secrets.choice(_NAMES)),
                   image=str(req.get("image") or "docker.io/library/ubuntu:22.04"),
                   argv=list(req["argv"]), env=env, policy=policy, retries=int(retries or 0),
                   labels=dict(req.get("labels") or {}))

    def inspect(self, where: Where, manager: str) -> dict[str, Any]:
        """The part of ``podman inspect``'s JSON that fleetclean and people read."""
        running = self.status == "running"
        return {
            "Id": self.id,
            "Created": containers.iso(self.created),
            "Path": self.argv[0],
            "Args": self.argv[1:],
            "State": {
                "OciVersion": "1.2.0", "Status": self.status, "Running": running,
                "Paused": False, "Restarting": False, "OOMKilled": False, "Dead": False,
                "Pid": self.pid if running else 0,
                "ConmonPid": self.conmon_pid if running else 0,
                "ExitCode": self.exit_code, "Error": "",
                "StartedAt": containers.iso(self.started_at),
                "FinishedAt": containers.iso(self.finished_at),
                "CgroupPath": "/" + Store(where).cgroup(self, manager) if running else "",
                "StoppedByUser": self.stopped_by_user,
            },
            "Image": self.image,
            "ImageName": self.image,
            "Name": self.name,
            "RestartCount": self.restart_count,
            "Driver": "overlay",
            "OCIRuntime": "crun",
            "Config": {"Hostname": self.id[:12], "Env": [f"{k}={v}" for k, v in self.env.items()],
                       "Cmd": self.argv, "Image": self.image, "Labels": self.labels,
                       "StopSignal": "SIGTERM", "CreateCommand": ["podman", "run", "-d"]},
            "HostConfig": {"RestartPolicy": {"Name": self.policy,
                                             "MaximumRetryCount": self.retries},
                           "PidMode": "private", "CgroupManager": manager,
                           "CgroupParent": "user.slice" if where.uid else "machine.slice"},
        }


class Store:
    """A user's containers: :meth:`locked` yields them and saves what the caller changed."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.path = os.path.join(where.runroot, "sim-containers.json")

    def userdata(self, cid: str) -> str:
        return os.path.join(self.where.runroot, "overlay-containers", cid, "userdata")

    def cgroup(self, c: Ctr, manager: str) -> str:
        if manager == "cgroupfs":
            return f"libpod_parent/libpod-{c.id}"
        return f"{self._slice()}/libpod-{c.id}.scope"

    def conmon_cgroup(self, c: Ctr, manager: str) -> str:
        if manager == "cgroupfs":
            return "libpod_parent/conmon"
        return f"{self._slice()}/libpod-conmon-{c.id}.scope"

    def _slice(self) -> str:
        uid = self.where.uid
        if uid == 0:
            return "machine.slice"
        return f"user.slice/user-{uid}.slice/user@{uid}.service/user.slice"

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Ctr]]:
        os.makedirs(self.where.runroot, mode=0o700, exist_ok=True)
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ctrs = self._load()
            yield ctrs
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({cid: asdict(c) for cid, c in ctrs.items()}, f)
            os.replace(tmp, self.path)

    def _load(self) -> dict[str, Ctr]:
        try:
            with open(self.path) as f:
                return {cid: Ctr(**data) for cid, data in json.load(f).items()}
        except FileNotFoundError:
            return {}


def find(ctrs: dict[str, Ctr], ref: str) -> Ctr | None:
    """By id, name, or a unique id prefix, as podman looks a container up."""
    if ref in ctrs:
        return ctrs[ref]
    named = [c for c in ctrs.values() if c.name == ref]
    if named:
        return named[0]
    prefixed = [c for c in ctrs.values() if ref and c.id.startswith(ref)]
    return prefixed[0] if len(prefixed) == 1 else None
