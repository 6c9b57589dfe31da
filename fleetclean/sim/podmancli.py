"""``podman`` on a simulated node: ``run -d``, ``ps``, ``inspect``, ``stop``, ``kill`` and
``container cleanup`` (conmon's exit command), as podman 5 prints them.

Runs inside a node (installed as ``/usr/local/sbin/podman`` once a Podman container was
started; standard library only). No daemon: each call reads and writes its user's store
(``podmanstate.py``): root's, or, for any other user, theirs in their runtime dir
(``XDG_RUNTIME_DIR``), so root's podman answers ``no container with name or ID "x"
found`` for a user's container. A rootless podman first makes a user namespace of its own
whose root is the user (as podman's re-exec does; ``dockerd.enter_user_namespace``).

``run -d [--name N] [--restart P] [-e K=V]... [--label K=V]... IMAGE COMMAND...`` starts a
conmon (``conmon.py``, double-forked) that runs the container; ``--cgroup-manager
systemd|cgroupfs`` (a global option, systemd by default) picks its cgroups. ``stop [-t
N]`` marks the container stopped by the user (so that no restart policy starts it
again), sends SIGTERM to its main process, SIGKILL after N seconds (10), waits, and prints
each name as given; ``kill [-s SIG]`` sends SIG (KILL) and marks it stopped by the user
too, as podman's Kill does. Restart policies as podman's:
conmon's exit command, ``podman container cleanup ID``, starts the container again at once
where ``always``, or ``on-failure[:N]`` after a non-zero exit (at most N times), unless it
was stopped by the user. Run by a systemd unit (INVOCATION_ID set), ``run`` leaves conmon
in the unit's cgroup, as podman does. Errors as podman's (``Error: ...``, exit 125).

>>> global_options(["--cgroup-manager", "cgroupfs", "--log-level=warning", "ps", "-a"])
({'cgroup-manager': 'cgroupfs', 'log-level': 'warning'}, ['ps', '-a'])
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import select
import signal
import sys
import time
from typing import Any

if __package__:
    from fleetclean.sim import containers, dockercli, dockerd, gotmpl, nodecg
    from fleetclean.sim import podmanstate as state
else:  # run as a script: the sibling modules are found through sys.path[0]
    import containers  # type: ignore[import-not-found,no-redef]
    import dockercli  # type: ignore[import-not-found,no-redef]
    import dockerd  # type: ignore[import-not-found,no-redef]
    import gotmpl  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import podmanstate as state  # type: ignore[import-not-found,no-redef]

HERE = os.path.dirname(os.path.abspath(__file__))
EXECUTABLE = "/usr/local/sbin/podman"  # where the node has it: conmon's exit command
USERNS = "_CONTAINERS_USERNS_CONFIGURED"  # podman's mark: already in its user namespace
NO_SUCH = 'no container with name or ID "{}" found: no such container'


class Failure(Exception):
    """What podman says (``Error: ...``) before it exits 125."""


def global_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """podman's global options (``--name value`` or ``--name=value``) before its command."""
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        word = rest.pop(0)[2:]
        key, has, value = word.partition("=")
        opts[key] = value if has else (rest.pop(0) if rest else "")
    return opts, rest


def _manager(opts: dict[str, str]) -> str:
    return opts.get("cgroup-manager") or "systemd"


# ------------------------------------------------------------------------- starting


def start(store: state.Store, c: state.Ctr, manager: str, in_unit: bool = False) -> None:
    """Start container ``c`` under a conmon of its own, double-forked; its state running.
    ``in_unit``: podman was run by a systemd unit (INVOCATION_ID set), whose cgroup conmon
    stays in, as podman's moveConmonToCgroupAndSignal leaves it (podman-restart.service's
    `podman start --all` at boot, any unit's `podman run`)."""
    where = store.where
    userdata = store.userdata(c.id)
    os.makedirs(userdata, exist_ok=True)
    config = {"args": c.argv, "env": c.env, "cgroup": store.cgroup(c, manager),
              "conmon_cgroup": "" if in_unit else store.conmon_cgroup(c, manager)}
    with open(os.path.join(userdata, "config.json"), "w") as f:
        json.dump(config, f)
    exits = os.path.join(where.tmpdir, "exits")
    os.makedirs(exits, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(exits, c.id))
    exit_args = ["--root", _graphroot(where), "--runroot", where.runroot, "--log-level",
                 "warning", "--cgroup-manager", manager, "--tmpdir", where.tmpdir,
                 "--runtime", "crun", "--storage-driver", "overlay", "--events-backend",
                 "journald" if manager == "systemd" else "file", "container", "cleanup",
                 c.id]
    args = ["--api-version", "1", "-c", c.id, "-u", c.id, "-r", "/usr/bin/crun", "-b",
            userdata, "-p", os.path.join(userdata, "pidfile"), "-n", c.name, "--exit-dir",
            exits, "--persist-dir", os.path.join(where.tmpdir, "persist", c.id),
            "--full-attach"]
    args += ["-s"] if manager == "systemd" else []
    args += ["-l", "journald", "--log-level", "warning", "--syslog", "--conmon-pidfile",
             os.path.join(userdata, "conmon.pid"), "--exit-command", EXECUTABLE]
    for word in exit_args:
        args += ["--exit-command-arg", word]
    rfd, wfd = os.pipe()
    os.set_inheritable(wfd, True)
    env = {"PATH": state.PATH, "_OCI_SYNCPIPE": str(wfd), "LANG": "C.UTF-8"}
    if where.uid:
        env.update({state.ROOTLESS_UID: str(where.uid), USERNS: "1",
                    "XDG_RUNTIME_DIR": where.run})
    child = os.fork()
    if child == 0:  # conmon's double fork: its parent becomes the node's init
        try:
            os.close(rfd)
            os.setsid()
            if os.fork() == 0:
                # Its own output is the journal's on a real node: none of the caller's.
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execve(sys.executable, [sys.executable, "-S", "-E",
                                           os.path.join(HERE, "conmon.py"), *args], env)
        finally:
            os._exit(0)
    os.close(wfd)
    os.waitpid(child, 0)
    try:
        ready, _, _ = select.select([rfd], [], [], 10)
        data = os.read(rfd, 64).split() if ready else []
    finally:
        os.close(rfd)
    if not data:
        raise Failure(f"{c.id}: conmon did not report the container's pid")
    c.pid = int(data[0])
    with open(os.path.join(userdata, "pidfile"), "w") as f:
        f.write(f"{c.pid}\n")
    with open(os.path.join(userdata, "conmon.pid")) as f:
        c.conmon_pid = int(f.read() or 0)
    c.status, c.started_at, c.exit_code = "running", time.time(), 0


def _graphroot(where: state.Where) -> str:
    """Where podman's images and database live (named in the exit command only: the
    simulator keeps its store in the run root, the node's /var/lib being this machine's)."""
    if where.uid == 0:
        return "/var/lib/containers/storage"
    return f"{pwd.getpwuid(where.uid).pw_dir}/.local/share/containers/storage"


def run(store: state.Store, args: argparse.Namespace, manager: str,
        in_unit: bool = False) -> int:
    env = dict(e.partition("=")[::2] for e in args.env)
    labels = dict(x.partition("=")[::2] for x in args.label)
    req: dict[str, Any] = {"name": args.name, "argv": args.argv, "image": args.image,
                           "restart": args.restart, "env": env, "labels": labels}
    with store.locked() as ctrs:
        if args.name and state.find(ctrs, args.name) is not None:
            taken = state.find(ctrs, args.name)
            assert taken is not None
            raise Failure(f'creating container storage: the container name "{args.name}" '
                          f"is already in use by {taken.id}. You have to remove that "
                          "container to be able to reuse that name: that name is already in "
                          "use, or use --replace to instruct Podman to do so.")
        c = state.Ctr.new(req)
        c.labels.setdefault("sim.cgroup-manager", manager)
        ctrs[c.id] = c
        start(store, c, manager, in_unit)
    print(c.id)
    return 0


def cleanup(store: state.Store, ref: str) -> int:
    """conmon's exit command: the container exited; its restart policy, as podman's."""
    with store.locked() as ctrs:
        c = state.find(ctrs, ref)
        if c is None:
            raise Failure(NO_SUCH.format(ref))
        try:
            with open(os.path.join(store.where.tmpdir, "exits", c.id)) as f:
                code = int(f.read() or 0)
        except (OSError, ValueError):
            code = 137
        if c.status == "running":
            c.status, c.exit_code, c.finished_at = "exited", code, time.time()
        c.pid = c.conmon_pid = 0
        if _restarts(c):
            c.restart_count += 1
            start(store, c, c.labels.get("sim.cgroup-manager", "systemd"))
    return 0


def _restarts(c: state.Ctr) -> bool:
    if c.stopped_by_user or c.policy in ("no", ""):
        return False
    if c.policy == "on-failure":
        return c.exit_code != 0 and (c.retries == 0 or c.restart_count < c.retries)
    return c.policy in ("always", "unless-stopped")


# ------------------------------------------------------------------------- stopping


def stop_or_kill(store: state.Store, args: argparse.Namespace) -> int:
    errors = []
    for ref in args.names:
        with store.locked() as ctrs:
            c = state.find(ctrs, ref)
            if c is None:
                errors.append(NO_SUCH.format(ref))
                continue
            if args.command == "kill" and c.status != "running":
                errors.append(f"can only kill running containers. {c.id} is in state "
                              f"{c.status}: container state improper")
                continue
            pid = c.pid if c.status == "running" else 0
            # Both mark it stopped by the user (libpod's Stop and Kill): no restart policy
            # starts it again, nor does an unless-stopped one come back at boot.
            if args.command == "stop" or pid:
                c.stopped_by_user = True
        if pid and args.command == "stop":
            _signal(pid, signal.SIGTERM)
            if not _gone(pid, args.time):
                _signal(pid, signal.SIGKILL)
                _gone(pid, 5)
            # As podman stop: the container's state is settled before it answers.
            with store.locked() as ctrs:
                c = ctrs[c.id]
                if c.status == "running" and c.pid == pid:
                    c.status, c.exit_code, c.finished_at = "exited", 143, time.time()
                    c.pid = c.conmon_pid = 0
        elif pid:
            _signal(pid, dockercli.signal_number(args.signal))
        print(ref)
    for text in errors[:-1]:
        print(f"Error: {text}", file=sys.stderr)
    if errors:
        raise Failure(errors[-1])
    return 0


def _signal(pid: int, sig: int) -> None:
    nodecg.signal_all([pid], sig)


def _gone(pid: int, timeout: float) -> bool:
    """Until ``pid`` is gone or a zombie (its conmon reaps it); False after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return True
        if stat[stat.rindex(b")") + 2 :][:1] == b"Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


# ------------------------------------------------------------------------- reading


def inspect(store: state.Store, args: argparse.Namespace, manager: str) -> int:
    with store.locked() as ctrs:
        found = [(ref, state.find(ctrs, ref)) for ref in args.names]
    objects = [c.inspect(store.where, c.labels.get("sim.cgroup-manager", manager))
               for _, c in found if c is not None]
    if args.format:
        for obj in objects:
            print(gotmpl.render(gotmpl.unescape(args.format), obj))
    else:
        print(json.dumps(objects, indent=4))
    missing = [ref for ref, c in found if c is None]
    if missing:
        # `podman container inspect` knows it wants a container; `podman inspect` any object.
        raise Failure(f'no such container "{missing[-1]}"' if args.container
                      else f'no such object: "{missing[-1]}"')
    return 0


def ps(store: state.Store, args: argparse.Namespace) -> int:
    with store.locked() as ctrs:
        shown = [c for c in ctrs.values() if args.all or c.status == "running"]
    shown.sort(key=lambda c: -c.created)
    views = [_view(c, not args.no_trunc) for c in shown]
    if args.quiet:
        for v in views:
            print(v["ID"])
    elif args.format:
        for v in views:
            print(gotmpl.render(gotmpl.unescape(args.format), v))
    else:
        dockercli.print_ps_table(views)  # podman's table, as docker's: Go's tabwriter
    return 0


def _view(c: state.Ctr, trunc: bool) -> dict[str, Any]:
    now = time.time()
    status = containers.ps_status(c.status, c.exit_code, c.started_at, c.finished_at, now)
    return {"ID": c.id[:12] if trunc else c.id, "Image": c.image, "Command": " ".join(c.argv),
            "RunningFor": containers.human_duration(now - c.created) + " ago",
            "Status": status, "State": c.status, "Ports": "", "Names": c.name,
            "Pid": c.pid, "Labels": c.labels, "Restarts": c.restart_count}


# ------------------------------------------------------------------------- the CLI


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="podman")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("-d", "--detach", action="store_true")
    r.add_argument("--name", default="")
    r.add_argument("--restart", default="no")
    r.add_argument("-e", "--env", action="append", default=[])
    r.add_argument("--label", "-l", action="append", default=[])
    r.add_argument("image")
    r.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND")
    dockercli.add_container_commands(sub, ("-t", "--type"))
    c = sub.add_parser("cleanup")
    c.add_argument("names", nargs="+")
    return parser.parse_args(argv)


def main(argv: list[str], environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ) if environ is None else environ
    opts, argv = global_options(argv)
    container = argv[:1] == ["container"]
    if container:  # `podman container ls|inspect|stop|kill|cleanup`
        argv = [{"ls": "ps", "list": "ps"}.get(argv[1], argv[1]), *argv[2:]] if argv[1:] else []
    args = parse_args(argv)
    args.container = container or args.command != "inspect" or \
        getattr(args, "type", "") == "container"
    where = state.Where.mine(environ)
    try:
        if where.uid and not environ.get(USERNS):
            # As podman's re-exec into its user namespace (the kernel refusing it: its error).
            try:
                dockerd.enter_user_namespace(where.uid, os.getgid())
            except OSError as exc:
                raise Failure(f"cannot set up namespace: {exc.strerror}") from exc
        store = state.Store(where)
        if args.command == "run":
            # As podman's: $INVOCATION_ID (a systemd unit's process) leaves conmon there.
            return run(store, args, _manager(opts), bool(environ.get("INVOCATION_ID")))
        if args.command == "ps":
            return ps(store, args)
        if args.command == "inspect":
            return inspect(store, args, _manager(opts))
        if args.command == "cleanup":
            return cleanup(store, args.names[0])
        return stop_or_kill(store, args)
    except Failure as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 125
    except gotmpl.TemplateError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
