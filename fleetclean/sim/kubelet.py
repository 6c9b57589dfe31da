"""The simulated node's kubelet: pods whose containers are restarted when they die.

Runs inside a node as the ``kubelet.service`` unit (``python3 kubelet.py --cgroup-driver
systemd|cgroupfs``, titled ``/usr/bin/kubelet ...``). It is also the CRI runtime that
``crictl`` (``crictl.py``) talks to on ``/run/containerd/containerd.sock`` (its own JSON
requests, not gRPC): there is no API server, a pod is given to it directly.

A pod is a sandbox (a ``/pause`` process) and its containers, each a shim and a container
init (``containers.py``), in the pod's cgroup: with the systemd driver
``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID with _>.slice/
cri-containerd-<ID>.scope`` (burstable alike, guaranteed pods right under
``kubepods.slice``), with cgroupfs ``/kubepods/besteffort/pod<UID>/<ID>``. Labels carry
the pod's namespace, name and UID (``io.kubernetes.pod.*``), which is how a node tells a
container's pod: ``crictl inspect``.

``restartPolicy: Always`` (the default) as the kubelet applies it: a container that exits
is replaced by a new one (a new id, ``attempt`` + 1) at once the first time, then after
10 s, doubling to at most 5 minutes (CrashLoopBackOff); ``OnFailure`` only after a
non-zero exit; ``Never`` not at all. Stopping a container (``crictl stop``) is an exit
like any other: the kubelet starts it again, as on a real node.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

if __package__:
    from fleetclean.sim import containers, daemonkit, nodecg
    from fleetclean.sim.proctitle import set_plain_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title  # type: ignore[import-not-found,no-redef]

SOCKET = containers.CONTAINERD_SOCK
TITLE = ("/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml "
         "--container-runtime-endpoint=unix:///run/containerd/containerd.sock")
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs.py")
FIRST_BACKOFF_S, MAX_BACKOFF_S = 10.0, 300.0


class PodContainer:
    """One container of a pod (one attempt: a restart is a new container)."""

    def __init__(self, pod: Pod, spec: dict[str, Any], env: dict[str, str],
                 attempt: int = 0) -> None:
        self.pod, self.spec, self.env = pod, spec, env
        self.name, self.image = str(spec["name"]), str(spec.get("image", "busybox"))
        self.argv = list(spec["argv"])
        self.id = containers.new_id()
        self.attempt = attempt
        self.state = "CONTAINER_CREATED"
        self.pid = self.exit_code = 0
        self.created = time.time()
        self.started_at = self.finished_at = 0.0

    def labels(self) -> dict[str, str]:
        return {
            "io.kubernetes.container.name": self.name,
            "io.kubernetes.pod.name": self.pod.name,
            "io.kubernetes.pod.namespace": self.pod.namespace,
            "io.kubernetes.pod.uid": self.pod.uid,
        }

    def status(self) -> dict[str, Any]:
        """``crictl inspect``'s JSON (the parts people and fleetclean read)."""
        pod = self.pod
        return {
            "status": {
                "id": self.id,
                "metadata": {"attempt": self.attempt, "name": self.name},
                "state": self.state,
                "createdAt": containers.iso(self.created),
                "startedAt": containers.iso(self.started_at),
                "finishedAt": containers.iso(self.finished_at),
                "exitCode": self.exit_code,
                "image": {"annotations": {}, "image": self.image},
                "imageRef": self.image,
                "reason": "Error" if self.state == "CONTAINER_EXITED" and self.exit_code else "",
                "message": "",
                "labels": self.labels(),
                "annotations": {"io.kubernetes.container.restartCount": str(self.attempt)},
                "mounts": [],
                "logPath": f"/var/log/pods/{pod.namespace}_{pod.name}_{pod.uid}/"
                           f"{self.name}/{self.attempt}.log",
            },
            "info": {"sandboxID": pod.sandbox, "pid": self.pid,
                     "runtimeType": "io.containerd.runc.v2"},
        }


class Pod:
    """A pod sandbox with its containers."""

    def __init__(self, name: str, namespace: str, qos: str, policy: str) -> None:
        self.name, self.namespace, self.qos, self.policy = name, namespace, qos, policy
        self.uid = str(uuid.uuid4())
        self.sandbox = containers.new_id()
        self.pause_pid = 0
        self.created = time.time()
        self.containers: list[PodContainer] = []
        self.backoff: dict[str, float] = {}

    def cgroup(self, driver: str) -> str:
        qos = "" if self.qos == "guaranteed" else self.qos
        if driver == "systemd":
            uid = self.uid.replace("-", "_")
            if not qos:
                return f"kubepods.slice/kubepods-pod{uid}.slice"
            return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice"
        return f"kubepods/{qos + '/' if qos else ''}pod{self.uid}"

    def info(self) -> dict[str, Any]:
        return {"id": self.sandbox, "name": self.name, "namespace": self.namespace,
                "uid": self.uid, "created": self.created, "state": "SANDBOX_READY"}


class Kubelet:
    def __init__(self, loop: daemonkit.Loop, driver: str) -> None:
        self.loop, self.driver = loop, driver
        self.tree = nodecg.Tree.load()
        self.pods: list[Pod] = []

    def scope(self, pod: Pod, cid: str) -> str:
        leaf = f"cri-containerd-{cid}.scope" if self.driver == "systemd" else cid
        return f"{pod.cgroup(self.driver)}/{leaf}"

    def _shim_title(self, pod: Pod) -> str:
        return (f"/usr/bin/containerd-shim-runc-v2 -namespace k8s.io -id {pod.sandbox} "
                f"-address {SOCKET}")

    def run_pod(self, req: dict[str, Any]) -> dict[str, Any]:
        pod = Pod(str(req["name"]), str(req.get("namespace", "default")),
                  str(req.get("qos", "besteffort")), str(req.get("restart_policy", "Always")))
        self.pods.append(pod)
        pause = [sys.executable, "-S", "-E", PROGRAMS,
                 json.dumps({"role": "holder", "title": "/pause", "comm": "pause"}).ljust(64)]
        _, pod.pause_pid = containers.start(
            self.loop, argv=pause, env={}, cgroup=self.scope(pod, pod.sandbox),
            shim_title=self._shim_title(pod), on_exit=lambda code: None)
        for spec in req.get("containers", []):
            env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "HOSTNAME": pod.name, "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                   "KUBERNETES_SERVICE_PORT": "443", **spec.get("env", {})}
            c = PodContainer(pod, spec, env)
            pod.containers.append(c)
            self._start(c)
        return {"ok": True, "uid": pod.uid, "sandbox": pod.sandbox,
                "containers": [c.id for c in pod.containers]}

    def _start(self, c: PodContainer) -> None:
        _, c.pid = containers.start(
            self.loop, argv=c.argv, env=c.env, cgroup=self.scope(c.pod, c.id),
            shim_title=self._shim_title(c.pod), on_exit=lambda code: self._exited(c, code))
        c.state, c.started_at = "CONTAINER_RUNNING", time.time()

    def _exited(self, c: PodContainer, code: int) -> None:
        c.state, c.exit_code, c.finished_at, c.pid = "CONTAINER_EXITED", code, time.time(), 0
        self.tree.remove(self.scope(c.pod, c.id))
        pod = c.pod
        if pod.policy == "Never" or (pod.policy == "OnFailure" and code == 0):
            return
        delay = pod.backoff.get(c.name)
        pod.backoff[c.name] = FIRST_BACKOFF_S if delay is None else min(MAX_BACKOFF_S, delay * 2)
        self.loop.after(0.05 if delay is None else delay, lambda: self._replace(c))

    def _replace(self, old: PodContainer) -> None:
        pod = old.pod
        new = PodContainer(pod, old.spec, old.env, old.attempt + 1)
        pod.containers = [c for c in pod.containers if c is not old] + [new]
        self._start(new)

    def find(self, ref: str) -> PodContainer | None:
        hits = [c for p in self.pods for c in p.containers if c.id.startswith(ref) and ref]
        return hits[0] if len(hits) == 1 else None

    def find_pod(self, ref: str) -> Pod | None:
        hits = [p for p in self.pods if ref and (p.sandbox.startswith(ref) or p.uid == ref)]
        return hits[0] if len(hits) == 1 else None

    def handle(self, req: dict[str, Any], reply: daemonkit.Reply) -> None:
        op = req.get("op")
        if op == "run_pod":
            reply(self.run_pod(req))
        elif op == "ps":
            rows = [c.status() for p in self.pods for c in p.containers
                    if req.get("all") or c.state == "CONTAINER_RUNNING"]
            reply({"ok": True, "containers": rows})
        elif op == "pods":
            reply({"ok": True, "pods": [p.info() for p in self.pods]})
        elif op == "inspect":
            c = self.find(str(req.get("ref", "")))
            reply({"ok": True, "status": c.status()} if c else {"error": "not found"})
        elif op == "inspectp":
            p = self.find_pod(str(req.get("ref", "")))
            reply({"ok": True, "pod": p.info()} if p else {"error": "not found"})
        elif op == "stop":
            self._stop(str(req.get("ref", "")), reply)
        else:
            reply({"error": f"unknown operation {op!r}"})

    def _stop(self, ref: str, reply: daemonkit.Reply) -> None:
        c = self.find(ref)
        if c is None:
            reply({"error": "not found"})
            return
        if c.pid:
            nodecg.signal_all([c.pid], 15)
            pid = c.pid
            self.loop.after(10, lambda: self._kill_if_same(c, pid))
        reply({"ok": True})


    def _kill_if_same(self, c: PodContainer, pid: int) -> None:
        if c.pid == pid:
            nodecg.signal_all([pid], 9)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubelet")
    parser.add_argument("--cgroup-driver", choices=("systemd", "cgroupfs"), default="systemd")
    # Only room in the argv area for the title set below (see proctitle.set_plain_title).
    parser.add_argument("--title-room", default="")
    args = parser.parse_args(argv)
    set_plain_title(TITLE, "kubelet")
    loop = daemonkit.Loop()
    kubelet = Kubelet(loop, args.cgroup_driver)
    loop.serve(SOCKET, kubelet.handle)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
