"""The simulated service manager (``fleetclean/sim/svcmgr.py``) when a stopped unit's main
process is reaped only after the stop found the unit empty: its SIGCHLD comes late (a zombie
counts as gone), and systemd leaves the unit stopped. Taken for a crash, a ``Restart=always``
unit came back after ``systemctl stop`` (a flake of test_supervisors.py under load).

The manager runs here with a stand-in event loop (timers run by the test, nothing forked) and
no cgroups; the unit's main process is a ``sleep`` this test starts in its own session, the
only process it signals."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from fleetclean.sim import nodecg, svcmgr, unitfile, unitstate


class Loop:
    """Timers kept for the test to run, in the order they fall due; a spawn records the
    start and forks nothing."""

    def __init__(self) -> None:
        self.timers: dict[int, tuple[float, Callable[[], None]]] = {}
        self.handles = 0
        self.spawned = 0

    def after(self, delay: float, fn: Callable[[], None]) -> int:
        self.handles += 1
        self.timers[self.handles] = (delay, fn)
        return self.handles

    def cancel(self, handle: int | None) -> None:
        if handle is not None:
            self.timers.pop(handle, None)

    def spawn(self, _child: Any, _on_exit: Any) -> int:
        self.spawned += 1
        return 4_000_000 + self.spawned  # no such PID: nothing to signal

    def run_next(self) -> None:
        """The timer due first (the shortest delay: they are all set within moments)."""
        handle = min(self.timers, key=lambda h: (self.timers[h][0], h))
        self.timers.pop(handle)[1]()

    def run_timers(self) -> None:
        while self.timers:
            self.run_next()


def manager(loop: Loop) -> svcmgr.Manager:
    made = svcmgr.Manager.__new__(svcmgr.Manager)
    made.loop = loop  # type: ignore[assignment]
    made.tree = nodecg.Tree(None)
    made.units = {}
    return made


def is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2:][:1] == b"Z"


def test_a_main_process_reaped_after_its_stop_leaves_the_unit_stopped() -> None:
    main = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        loop = Loop()
        mgr = manager(loop)
        unit = unitstate.Unit("trainer.service", None, unitfile.UnitFile(restart="always"))
        unit.active, unit.sub, unit.main_pid, unit.exec_pid = "active", "running", main.pid, \
            main.pid
        replies: list[dict[str, Any]] = []
        mgr.stop(unit, replies.append)  # SIGTERM to the sleep, then polls until it is gone
        deadline = time.monotonic() + 10
        while not is_zombie(main.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # The poll sees the zombie as gone before the manager reaps it: stopped.
        while not replies and loop.timers and time.monotonic() < deadline:
            loop.run_next()
        assert replies == [{"ok": True}]
        assert (unit.active, unit.sub) == ("inactive", "dead")
        # Now its SIGCHLD: the exit of the main process the stop already saw go.
        mgr._main_exited(unit, signal.SIGTERM)  # a wait status: killed by SIGTERM
        loop.run_timers()
        assert (unit.active, unit.sub, unit.main_pid) == ("inactive", "dead", 0)
        assert loop.spawned == 0  # not started again
    finally:
        main.kill()
        main.wait()
