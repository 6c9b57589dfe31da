"""The simulated node's service manager: what systemd does for the units fleetclean meets.

Runs inside a node as ``python3 svcmgr.py`` (standard library only), started on first use
by :func:`ensure`; ``systemctl`` (``systemctl.py``) talks to it on ``/run/systemd/private``.
Units are files in ``/run/systemd/system`` (``/run/systemd/user`` for user units: the
node's /etc is this machine's, so runtime units are the only ones), loaded on first use.

What it does as systemd does (systemd.service(5), systemd.kill(5)):

- ``start``: the unit's process in its own session and in its cgroup,
  ``system.slice/NAME.service`` (a user unit: ``user.slice/user-UID.slice/user@UID.service/
  app.slice/NAME.service``), with systemd's environment and ``Environment=``.
- ``Type=oneshot`` with ``RemainAfterExit=yes`` (podman-restart.service): its process
  exits, the unit stays ``active (exited)`` with what that process left in its cgroup (a
  conmon: podman leaves it there, INVOCATION_ID being set), until ``stop``.
- the main process exits: what is left of the unit's cgroup gets SIGTERM; then
  ``Restart=always`` (or ``on-failure``... ) starts it again after ``RestartSec`` (100 ms by
  default), at most 5 starts in 10 s (then the unit is ``failed``, start-limit-hit).
  ``Restart=no``: ``inactive`` after a clean exit, ``failed`` otherwise.
- ``stop``: ``KillSignal`` to the cgroup (``KillMode=control-group``; ``process``: the main
  process only), SIGKILL after ``TimeoutStopSec``; answered once stopped; a stopped unit
  stays stopped.

``ssh.service`` (the node's sshd) and ``slurmd.service`` are known without unit files, as
a real node's would be: active, with their MainPID, ``KillMode=process``; they can be
stopped, not started again. The manager is its own process here (titled
``/lib/systemd/systemd --system``), not PID 1: units' processes are its children.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from typing import Any

if __package__:
    from fleetclean.sim import daemonkit, nodecg, unitfile, unitstate
    from fleetclean.sim.proctitle import set_plain_title
else:  # run as a script: the sibling modules are found through sys.path[0]
    import daemonkit  # type: ignore[import-not-found,no-redef]
    import nodecg  # type: ignore[import-not-found,no-redef]
    import unitfile  # type: ignore[import-not-found,no-redef]
    import unitstate  # type: ignore[import-not-found,no-redef]
    from proctitle import set_plain_title  # type: ignore[import-not-found,no-redef]

SOCKET = "/run/systemd/private"
UNIT_DIRS = {"system": "/run/systemd/system", "user": "/run/systemd/user"}
START_LIMIT_BURST = 5
START_LIMIT_INTERVAL_S = 10.0
CLEAN_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)
# Units a real node has without us: where their main PID is written.
ADOPTED = {"ssh.service": "/run/fleetclean/listener.state",
           "slurmd.service": "/run/fleetclean/slurmd.pid"}


class Manager:
    """The daemon: units by (uid or None, name), and the requests of systemctl."""

    def __init__(self, loop: daemonkit.Loop) -> None:
        self.loop = loop
        self.tree = nodecg.Tree.load()
        self.units: dict[tuple[int | None, str], unitstate.Unit] = {}
        for name in ADOPTED:
            self._adopt(name)

    # -- loading -------------------------------------------------------------------

    def _adopt(self, name: str) -> None:
        pid = _adopted_pid(ADOPTED[name])
        if not pid:
            return
        spec = unitfile.UnitFile(kill_mode="process", restart="on-failure")
        unit = unitstate.Unit(name, None, spec)
        unit.adopted, unit.main_pid, unit.exec_pid = True, pid, pid
        unit.active, unit.sub, unit.started_at = "active", "running", time.time()
        unit.invocation = secrets.token_hex(16)
        self.units[(None, name)] = unit

    def unit(self, name: str, uid: int | None, reload: bool = False) -> unitstate.Unit:
        """The unit, loaded from its file on first use (or when ``reload``); a unit with
        no file has ``spec`` None (LoadState=not-found)."""
        key = (uid, name)
        known = self.units.get(key)
        if known is not None and (not reload or known.adopted):
            return known
        path = os.path.join(UNIT_DIRS["system" if uid is None else "user"], name)
        try:
            with open(path) as f:
                spec = unitfile.parse(f.read())
        except OSError:
            spec, path = None, ""
        if known is not None:
            known.spec, known.path = spec, path
            return known
        unit = unitstate.Unit(name, uid, spec, path)
        if spec is not None:
            self.units[key] = unit
        return unit

    # -- requests ------------------------------------------------------------------

    def handle(self, req: dict[str, Any], reply: daemonkit.Reply) -> None:
        op, uid = req.get("op", ""), req.get("uid")
        if op == "daemon-reload":
            for u_uid, name in list(self.units):
                self.unit(name, u_uid, reload=True)
            reply({"ok": True})
            return
        unit = self.unit(str(req.get("unit", "")), uid)
        if op == "show":
            reply({"ok": True, "props": unit.props()})
        elif op == "start":
            self.start(unit, reply)
        elif op == "stop":
            self.stop(unit, reply, block=bool(req.get("block", True)))
        else:
            reply({"error": f"unknown operation {op!r}", "code": 1})

    def start(self, unit: unitstate.Unit, reply: daemonkit.Reply) -> None:
        if unit.spec is None:
            reply({"error": f"Unit {unit.name} not found.", "code": 5})
            return
        if unit.active in ("active", "deactivating") or unit.adopted:
            if unit.adopted and unit.active != "active":
                reply({"error": f"Unit {unit.name} cannot be started again here.", "code": 1})
            else:
                reply({"ok": True})
            return
        self.loop.cancel(unit.timer)
        if not self._launch(unit):
            reply({"error": f"start of {unit.name} was attempted too often", "code": 1,
                   "job": "failed because start of the service was attempted too often"})
            return
        reply({"ok": True})

    def _launch(self, unit: unitstate.Unit) -> bool:
        """Fork the unit's main process; False (and the unit failed) past the start limit."""
        now = time.monotonic()
        unit.starts = [t for t in unit.starts if now - t < START_LIMIT_INTERVAL_S] + [now]
        if len(unit.starts) > START_LIMIT_BURST:
            unit.active, unit.sub, unit.result = "failed", "failed", "start-limit-hit"
            return False
        assert unit.spec is not None
        spec = unit.spec
        unit.main_pid = unit.exec_pid = self.loop.spawn(
            lambda: unitstate.exec_unit(unit.name, unit.uid, spec, unit.cgroup, self.tree),
            lambda status: self._main_exited(unit, status),
        )
        unit.active, unit.sub, unit.result = "active", "running", "success"
        unit.started_at, unit.invocation = time.time(), secrets.token_hex(16)
        return True

    def _main_exited(self, unit: unitstate.Unit, status: int) -> None:
        code, sig = daemonkit.exit_code(status)
        unit.exec_code, unit.exec_status = (2, sig) if sig else (1, code)
        unit.main_pid = 0
        if unit.active == "deactivating":
            return  # stop() polls until the rest is gone
        if unit.active in ("inactive", "failed"):
            # Reaped after a stop already found the unit empty (a zombie is not alive): the
            # unit stays stopped, as systemd's does; taken for a crash, it was restarted.
            return
        clean = (sig == 0 and code == 0) or sig in CLEAN_SIGNALS
        unit.result = "success" if clean else ("signal" if sig else "exit-code")
        spec = unit.spec
        if spec is not None and spec.type == "oneshot" and spec.remain_after_exit and clean:
            unit.active, unit.sub = "active", "exited"
            return
        unit.active, unit.sub = "deactivating", "stop-sigterm"
        self._kill(unit, unit.spec.kill_signal if unit.spec else signal.SIGTERM)
        self._when_empty(unit, lambda: self._after_exit(unit, clean, sig))

    def _after_exit(self, unit: unitstate.Unit, clean: bool, sig: int) -> None:
        if unit.stopping:
            # systemctl stop came while the rest of the unit was going: stopped, for good.
            self._stopped(unit, None)
            return
        policy = unit.spec.restart if unit.spec else "no"
        restart = {
            "always": True,
            "on-failure": not clean,
            "on-success": clean,
            "on-abnormal": bool(sig) and not clean,
            "on-abort": bool(sig) and not clean,
        }.get(policy, False)
        if not restart:
            unit.active, unit.sub = ("inactive", "dead") if clean else ("failed", "failed")
            self.tree.remove(unit.cgroup)
            return
        unit.active, unit.sub = "activating", "auto-restart"
        delay = unit.spec.restart_sec if unit.spec else 0.1
        unit.timer = self.loop.after(delay, lambda: self._restart(unit))

    def _restart(self, unit: unitstate.Unit) -> None:
        unit.timer = None
        if unit.active != "activating":
            return
        unit.n_restarts += 1
        self._launch(unit)

    def stop(self, unit: unitstate.Unit, reply: daemonkit.Reply, block: bool = True) -> None:
        if unit.spec is None:
            reply({"error": f"Unit {unit.name} not loaded.", "code": 5})
            return
        if unit.sub == "auto-restart" or (unit.active in ("inactive", "failed")):
            self.loop.cancel(unit.timer)
            if unit.sub == "auto-restart":
                unit.active, unit.sub = "inactive", "dead"
            reply({"ok": True})
            return
        unit.waiters.append(reply) if block else reply({"ok": True})
        if unit.active == "deactivating" and unit.main_pid == 0:
            unit.stopping = True  # on its way down after an exit: it will not restart
            return
        unit.active, unit.sub = "deactivating", "stop-sigterm"
        spec = unit.spec
        self._kill(unit, spec.kill_signal)
        final = self.loop.after(spec.timeout_stop_sec, lambda: self._final_kill(unit))
        self._when_empty(unit, lambda: self._stopped(unit, final))

    def _final_kill(self, unit: unitstate.Unit) -> None:
        unit.sub, unit.result = "final-sigkill", "timeout"
        nodecg.signal_all(self._members(unit), signal.SIGKILL)

    def _stopped(self, unit: unitstate.Unit, final: int | None) -> None:
        self.loop.cancel(final)
        unit.stopping = False
        timed_out = unit.result == "timeout"
        unit.active, unit.sub = ("failed", "failed") if timed_out else ("inactive", "dead")
        unit.main_pid = 0
        self.tree.remove(unit.cgroup)
        waiters, unit.waiters = unit.waiters, []
        for reply in waiters:
            reply({"ok": True})

    # -- the unit's processes ------------------------------------------------------

    def _members(self, unit: unitstate.Unit) -> list[int]:
        """The unit's live processes: its cgroup, or without cgroups its session."""
        if self.tree.mode != "none":
            found = [p for p in self.tree.procs(unit.cgroup) if _alive(p)]
        else:
            found = nodecg.session_members(unit.exec_pid) if unit.exec_pid else []
        if unit.main_pid and _alive(unit.main_pid) and unit.main_pid not in found:
            found.append(unit.main_pid)
        return found

    def _kill(self, unit: unitstate.Unit, sig: int) -> None:
        mode = unit.spec.kill_mode if unit.spec else "control-group"
        if mode in ("process", "mixed"):
            targets = [unit.main_pid] if unit.main_pid else []
        elif mode == "none":
            targets = []
        else:
            targets = self._members(unit)
        nodecg.signal_all(targets, sig)

    def _when_empty(self, unit: unitstate.Unit, then: Any) -> None:
        """Poll every 10 ms until the unit's processes are gone (its main process only,
        for KillMode=process), then call ``then``."""
        mode = unit.spec.kill_mode if unit.spec else "control-group"

        def check() -> None:
            if unit.main_pid and unit.adopted and not _alive(unit.main_pid):
                unit.main_pid = 0
            if mode == "mixed" and not unit.main_pid:
                nodecg.signal_all(self._members(unit), signal.SIGKILL)
            left = [unit.main_pid] if unit.main_pid else []
            if mode not in ("process", "none"):
                left = self._members(unit)
            if left:
                self.loop.after(0.01, check)
            else:
                then()

        check()

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] != b"Z"


def _adopted_pid(path: str) -> int:
    """The main PID a node file names (``listener.state``: its third word; a pid file)."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return 0
    if path.endswith("listener.state"):
        words = words[2:]
    return int(words[0]) if words and words[0].isdigit() else 0


def ensure() -> None:
    """Start the manager unless it runs; returns once it answers on its socket."""
    os.makedirs(unitstate.JOURNAL, exist_ok=True)
    argv = [sys.executable, "-S", "-E", os.path.abspath(__file__)]
    probe = {"op": "show", "unit": "ssh.service"}
    daemonkit.ensure_daemon(SOCKET, argv, os.path.join(unitstate.JOURNAL, "systemd.log"), probe)


def main() -> None:
    # Where a real node's systemd is: the init's cgroup.
    nodecg.Tree.load().place(0, nodecg.unit_placement("init.scope"))
    with contextlib.suppress(OSError):
        set_plain_title("/lib/systemd/systemd --system", "systemd")
    for path in UNIT_DIRS.values():
        os.makedirs(path, exist_ok=True)
    loop = daemonkit.Loop()
    manager = Manager(loop)
    loop.serve(SOCKET, manager.handle)
    loop.run()


if __name__ == "__main__":
    main()
    sys.exit(0)
