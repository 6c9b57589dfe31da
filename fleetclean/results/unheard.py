"""Which hosts ran a teardown from this controller whose end it did not hear: their next
runs ask the node for what that teardown did.

A teardown that loses its controller with an error (SIGPIPE, SIGHUP) knows it, and tells
the host's next run by itself (lib.sh: the journal). One whose connection stalls without
an error cannot know: a network that drops silently while sshd still takes the output, or
a controller stopped, then killed, with the output waiting in its socket. It finishes,
believes it was heard, and keeps its journal as "heard" under its run's token
(:func:`token`, ``FC_RUN``). The controller notes every host of a teardown with that token
before the first connection (:func:`begin`: a controller killed mid-run leaves them so),
as in flight while the run that noted it lives, and settles it when the run ends
(:func:`settle`): forgotten where it heard the script's end or the script never started,
kept otherwise. A host's next runs pass its kept tokens on (``FC_UNHEARD``; not one still
in flight, whose journal is not over); the node sends each such journal once and answers
for every token it has dealt with (an ``unheard`` record: told, or nothing kept under it),
and only then is the token forgotten: a run that never reached the node, or found its
lock taken, leaves it asked for.

Kept in ``$FLEETCLEAN_STATE_DIR/unheard.json``, each host with its tokens (the newest
:data:`KEEP`), when each was noted and, while its run is in flight, that run's process
and machine; after 30 days a note is dropped. Read, changed and written under a lock of
its own (:func:`statefile.update_hosts`): two runs that end at once keep both their notes.

>>> import os, tempfile
>>> from fleetclean.models import HostResult, HostStatus, RunResult
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> begin(["gpu01", "gpu02", "gpu03"], "r1")
>>> settle(RunResult("post-extraction", 1.0, (
...     HostResult("gpu01", HostStatus.CLEAN, started=True, ended=True),
...     HostResult("gpu02", HostStatus.TIMEOUT, started=True),
...     HostResult("gpu03", HostStatus.UNREACHABLE))), "r1")
>>> load()
{'gpu02': 'r1'}
>>> begin(["gpu02"], "r2")   # r1 still asked for by r2's script
>>> settle(RunResult("post-extraction", 1.0, (HostResult("gpu02", HostStatus.TIMEOUT,
...                                           started=True, answered=("r1",)),)), "r2")
>>> load()
{'gpu02': 'r2'}
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fleetclean.models import RunResult
from fleetclean.results.statefile import read_hosts, update_hosts

FILE = "unheard.json"
# A note older than this is dropped: the host may have left the fleet.
KEEP_S = 30 * 24 * 3600
# Tokens a host keeps at most (the newest); a node keeps its 64 newest heard journals.
KEEP = 8
# A run in flight is taken for over after this long, whatever its PID says (used again by
# another process; on another machine, one that shares the state directory, it cannot be
# asked at all): no teardown runs that long.
FLIGHT_S = 3600
# The largest PID Linux gives (pid_max's ceiling); macOS's are smaller.
_PID_MAX = 4_194_304


@dataclass(frozen=True)
class Note:
    run: str  # the teardown's token
    at: float  # when it was noted, epoch seconds
    pid: int = 0  # while in flight: the process that runs it (0: settled)
    machine: str = ""  # and the machine it runs on

    def in_flight(self, now: float) -> bool:
        # After FLIGHT_S, or where the PID is this process's (which has begun no run yet
        # when it asks: a PID used again, as a container's controller is PID 1 each time),
        # the run is over whatever the PID says.
        if not self.pid or now - self.at >= FLIGHT_S or self.pid == os.getpid():
            return False
        if self.machine != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)  # signal 0: is it there (nothing is sent)
        except ProcessLookupError:
            return False
        except OSError:
            return True  # there, another user's
        return True


Notes = dict[str, list[Note]]


def token() -> str:
    """A teardown's token: random, so that no other run's journal matches it."""
    return os.urandom(6).hex()


def load(now: float | None = None) -> dict[str, str]:
    """``{host: "token token ..."}`` of the hosts with a teardown from here not heard to
    the end and no longer in flight, as ``FC_UNHEARD`` takes them; empty where the file is
    missing or unreadable."""
    now = time.time() if now is None else now
    asked = {}
    for host, notes in _notes(read_hosts(FILE), now).items():
        tokens = [n.run for n in notes if not n.in_flight(now)]
        if tokens:
            asked[host] = " ".join(tokens)
    return asked


def begin(hosts: Iterable[str], run: str, now: float | None = None) -> None:
    """Note every host of the teardown ``run`` as in flight, beside the tokens it has
    (its script asks for those)."""
    note = Note(run, time.time() if now is None else now, os.getpid(), socket.gethostname())
    names = list(hosts)

    def change(notes: Notes) -> None:
        for host in names:
            notes[host] = [*notes.get(host, []), note][-KEEP:]

    _update(change, now)


def settle(result: RunResult, run: str = "", now: float | None = None) -> None:
    """What ``result`` settled: each token a host's node answered for is forgotten; the
    teardown ``run``'s own is forgotten where its script was heard to the end or never
    started, and kept, no longer in flight, where it was not heard to the end."""
    answered = {h.host: set(h.answered) for h in result.hosts}
    # "Not started" is the run's word only where it was not interrupted: a Ctrl-C that
    # comes after the hosts' loop calls every host not started.
    done = {h.host: h.ended or (not h.started and not result.interrupted)
            for h in result.hosts}

    def change(notes: Notes) -> None:
        for host in set(notes) & set(answered):
            left = []
            for note in notes[host]:
                if note.run in answered[host] or (note.run == run and done[host]):
                    continue
                left.append(Note(note.run, note.at) if note.run == run else note)
            if left:
                notes[host] = left
            else:
                del notes[host]

    if run or any(answered.values()):
        _update(change, now)


def _update(change: Callable[[Notes], None], now: float | None) -> None:
    def apply(hosts: dict[str, Any]) -> dict[str, Any]:
        notes = _notes(hosts, time.time() if now is None else now)
        change(notes)
        return {h: [[n.run, n.at, n.pid, n.machine] if n.pid else [n.run, n.at]
                    for n in kept] for h, kept in notes.items()}

    update_hosts(FILE, apply)


def _notes(hosts: dict[str, Any], now: float) -> Notes:
    """The file's hosts as notes, each one well formed and younger than KEEP_S."""
    notes: Notes = {}
    for host, entries in hosts.items():
        kept = []
        for entry in entries if isinstance(entries, list) else ():
            try:
                run, at = str(entry[0]), float(entry[1])
                pid, machine = (int(entry[2]), str(entry[3])) if len(entry) > 3 else (0, "")
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                continue
            pid = pid if 0 < pid <= _PID_MAX else 0  # never a group or an absurd number
            if run.isalnum() and run.isascii() and math.isfinite(at) and now - at < KEEP_S:
                kept.append(Note(run, at, pid, machine))
        if kept:
            notes[str(host)] = kept[-KEEP:]
    return notes
