"""The record of every host process the simulator started, and killing them safely.

Each line of the pid file is ``PID START_TIME ROLE``: START_TIME is field 22 of
/proc/PID/stat (clock ticks since boot), so a PID the kernel has since given to another
process is never signalled. Any process that reads the file (``fleetclean sim down`` from
another shell, a test's teardown) can stop the fleet.

Example: ``record(path, 4242, "init:node01")`` then ``kill_all(load(path))`` sends SIGKILL
to 4242 only if it is still the same process, and waits until it is gone.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Recorded:
    pid: int
    start_time: int
    role: str


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None if there is no such process."""
    return stat_fields_of(f"/proc/{pid}/stat")


PF_EXITING, PF_DUMPCORE, SIGKILL_BIT = 0x4, 0x200, 0x100


def live_thread(pid: int) -> int | None:
    """Where ``pid``'s main thread has ended (a zombie, ``ps``: ``Zl``) while the process
    lives on in another thread (its main thread called pthread_exit), that thread's TID:
    one not in its exit (PF_EXITING, or dumping the core) and without SIGKILL pending (its
    own, stat's field 31; the process's, status's ShdPnd), which every thread of a killed
    process has until its exit begins. None for a zombie that is dead, or killed."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except (OSError, ValueError):
        return None
    for tid in sorted(tids):
        fields = stat_fields_of(f"/proc/{pid}/task/{tid}/stat")
        if fields is None or fields[0] in "ZX":
            continue
        if int(fields[6]) & (PF_EXITING | PF_DUMPCORE) or int(fields[28]) & SIGKILL_BIT:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        shared = next((line.split()[1] for line in status.splitlines()
                       if line.startswith("ShdPnd:")), "0")
        return None if int(shared, 16) & SIGKILL_BIT else tid
    return None


def stat_fields_of(path: str) -> list[str] | None:
    """Fields 3.. of the stat file at ``path``, or None where it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def start_time(pid: int) -> int | None:
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def record(path: Path, pid: int, role: str) -> Recorded:
    """Append ``pid`` to the pid file; raises ProcessLookupError if it already exited."""
    started = start_time(pid)
    if started is None:
        raise ProcessLookupError(pid)
    entry = Recorded(pid, started, role)
    with path.open("a") as f:
        f.write(f"{pid} {started} {role}\n")
    return entry


def load(path: Path) -> list[Recorded]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        pid, started, role = line.split(maxsplit=2)
        entries.append(Recorded(int(pid), int(started), role))
    return entries


def is_alive(entry: Recorded) -> bool:
    """Same process still there and not a zombie (a zombie holds nothing and is only
    waiting for its parent to collect it)."""
    fields = stat_fields(entry.pid)
    return fields is not None and int(fields[19]) == entry.start_time and fields[0] != "Z"


def signal_entry(entry: Recorded, sig: int) -> bool:
    """Send ``sig`` if the entry is still the process we started. True if sent."""
    if not is_alive(entry):
        return False
    try:
        os.kill(entry.pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_all(entries: Iterable[Recorded], timeout: float = 10.0) -> list[Recorded]:
    """SIGKILL every live entry, node inits first (the kernel then empties their PID
    namespaces), and wait. Returns the entries still alive after ``timeout``."""
    ordered = sorted(entries, key=lambda e: not e.role.startswith("init"))
    for entry in ordered:
        signal_entry(entry, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    left = [e for e in ordered if is_alive(e)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [e for e in left if is_alive(e)]
    return left
