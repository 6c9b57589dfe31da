"""One unit of the simulated service manager: its state, the properties ``systemctl show``
prints, and how its main process is started. Node side, standard library only (a sibling
module of ``svcmgr.py``).

>>> unit = Unit("vllm.service", None, unitfile.UnitFile(restart="always"))
>>> dict(unit.props())["RestartUSec"], unit.cgroup
('100ms', 'system.slice/vllm.service')
"""

from __future__ import annotations

import os
import pwd
import secrets
import time

if __package__:
    from fleetclean.sim import daemonkit, nodecg, unitfile
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import unitfile  # type: ignore[import-not-found,no-redef]

JOURNAL = "/run/fleetclean/journal"
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Unit:
    """One loaded unit and its state (ActiveState/SubState as systemctl shows them)."""

    def __init__(self, name: str, uid: int | None, spec: unitfile.UnitFile | None,
                 path: str = "") -> None:
        self.name, self.uid, self.spec, self.path = name, uid, spec, path
        self.active, self.sub, self.result = "inactive", "dead", "success"
        self.main_pid = 0
        self.adopted = False
        self.n_restarts = 0
        self.starts: list[float] = []
        self.waiters: list[daemonkit.Reply] = []  # systemctl stop calls waiting for it
        self.stopping = False  # a stop asked while it was going down after an exit
        self.timer: int | None = None
        self.exec_code = self.exec_status = 0
        self.exec_pid = 0
        self.started_at = 0.0
        self.invocation = ""

    @property
    def cgroup(self) -> str:
        if self.uid is None:
            return f"system.slice/{self.name}"
        return f"{manager_cgroup(self.uid)}/app.slice/{self.name}"

    def props(self) -> list[list[str]]:
        """``[[key, value], ...]`` in systemctl show's order (the Service interface's
        properties, then the Unit's), for the subset the simulator knows."""
        unit = self
        spec = unit.spec or unitfile.UnitFile()
        loaded = unit.spec is not None
        started = _timestamp(self.started_at) if self.started_at else ""
        argv = " ".join(spec.exec_start)
        return [
            ["Type", spec.type],
            ["Restart", spec.restart],
            ["PIDFile", spec.pid_file],
            ["RestartUSec", timespan(spec.restart_sec)],
            ["TimeoutStopUSec", timespan(spec.timeout_stop_sec)],
            ["MainPID", str(self.main_pid)],
            ["ControlPID", "0"],
            ["Result", self.result],
            ["NRestarts", str(self.n_restarts)],
            ["ExecMainStartTimestamp", started],
            ["ExecMainPID", str(self.exec_pid)],
            ["ExecMainCode", str(self.exec_code)],
            ["ExecMainStatus", str(self.exec_status)],
            ["ExecStart", f"{{ path={spec.exec_start[0]} ; argv[]={argv} }}" if argv else ""],
            ["Slice", "system.slice" if self.uid is None else "app.slice"],
            ["ControlGroup", "/" + self.cgroup if loaded and self.active != "inactive" else ""],
            ["KillMode", spec.kill_mode],
            ["KillSignal", str(spec.kill_signal)],
            ["User", spec.user],
            ["Id", self.name],
            ["Names", self.name],
            ["Description", spec.description or (self.name if loaded else "")],
            ["LoadState", "loaded" if loaded else "not-found"],
            ["ActiveState", self.active],
            ["FreezerState", "running"],
            ["SubState", self.sub],
            ["FragmentPath", self.path],
            ["UnitFileState", "" if self.adopted or not loaded else "static"],
            ["InvocationID", self.invocation],
        ]


def timespan(s: float) -> str:
    """systemd's format_timespan: ``100ms``, ``2s``, ``1min 30s``, ``infinity``.

    >>> timespan(0.1), timespan(90), timespan(2), timespan(float("inf"))
    ('100ms', '1min 30s', '2s', 'infinity')
    """
    if s == float("inf"):
        return "infinity"
    if s < 1:
        return f"{round(s * 1000)}ms"
    minutes, rest = divmod(round(s), 60)
    parts = ([f"{minutes}min"] if minutes else []) + ([f"{rest}s"] if rest else [])
    return " ".join(parts) or "0"


def _timestamp(t: float) -> str:
    return time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def exec_unit(name: str, uid: int | None, spec: unitfile.UnitFile, cgroup: str,
               tree: nodecg.Tree) -> None:
    """In the forked child: become the unit's main process, as systemd's exec does. A user
    unit's manager gets what logind and systemd give it on a real node before its first
    unit runs: the user's runtime directory, ``/run/user/UID`` (mode 0700, the user's), and
    its own cgroup delegated to the user (``user@UID.service``, ``Delegate=yes``)."""
    os.setsid()
    tree.place(0, nodecg.unit_placement(cgroup))
    env = {"PATH": UNIT_PATH, "LANG": "C.UTF-8", "INVOCATION_ID": secrets.token_hex(16)}
    user = spec.user or (str(uid) if uid is not None else "")
    # Opened while still root: the journal is root's, whoever the unit runs as.
    log = _journal(name, uid)
    if user:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name,
                   SHELL=entry.pw_shell)
        if uid is not None:
            env["XDG_RUNTIME_DIR"] = runtime_dir(entry.pw_uid, entry.pw_gid)
            tree.delegate(manager_cgroup(uid), entry.pw_uid, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.initgroups(entry.pw_name, entry.pw_gid)
        os.setuid(entry.pw_uid)
    env.update(spec.environment)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir("/")
    os.execve(spec.exec_start[0], spec.exec_start, env)


def manager_cgroup(uid: int) -> str:
    """The cgroup of user ``uid``'s service manager, above its units and scopes."""
    return f"user.slice/user-{uid}.slice/user@{uid}.service"


def runtime_dir(uid: int, gid: int) -> str:
    """``/run/user/UID``, made as logind's user-runtime-dir@UID.service makes it (mode
    0700, the user's) where it is missing; its path."""
    path = f"/run/user/{uid}"
    if not os.path.isdir(path):
        os.makedirs("/run/user", mode=0o755, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chown(path, uid, gid)
    return path


def _journal(name: str, uid: int | None) -> int:
    """The unit's journal file, open for appending: ``JOURNAL/NAME.log``, a user unit's
    in its manager's folder (``JOURNAL/user@UID.service/NAME.log``): every user's
    ``docker.service`` has its own."""
    folder = JOURNAL if uid is None else os.path.join(JOURNAL, f"user@{uid}.service")
    os.makedirs(folder, exist_ok=True)
    return os.open(os.path.join(folder, name + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                   0o644)
