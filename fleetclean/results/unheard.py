"""Which hosts ran a teardown from this controller whose end it did not hear: their next
runs ask the node for what that teardown did.

A teardown that loses its controller with an error (SIGPIPE, SIGHUP) knows it, and tells
the host's next run by itself (lib.sh: the journal). One whose connection stalls without
an error cannot know: a network that drops silently while sshd still takes the output, or
a controller stopped, then killed, with the output waiting in its socket. It finishes,
believes it was heard, and keeps its journal as "heard" under its run's token
(:func:`token`, ``FC_RUN``). The controller notes every host of a teardown with that token
before the first connection (:func:`begin`: a controller killed mid-run leaves them so)
and forgets it where it hears the script's end (:func:`settle`). A host's next runs pass
its tokens on (``FC_UNHEARD``); the node sends each such journal once and answers for
every token it has dealt with (an ``unheard`` record: told, or nothing kept under it), and
only then is the token forgotten: a run that never reached the node, or found its lock
taken, leaves it asked for.

Kept in ``$FLEETCLEAN_STATE_DIR/unheard.json``, each host with its tokens (the newest
:data:`KEEP` teardowns not heard: a node keeps about as many) and when each was noted;
after 30 days a note is dropped. Read, changed and written under a lock of its own
(:func:`statefile.update_hosts`): two runs that end at once keep both their notes.

>>> import os, tempfile
>>> from fleetclean.models import HostResult, HostStatus, RunResult
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> begin(["gpu01", "gpu02"], "r1")
>>> settle(RunResult("post-extraction", 1.0, (HostResult("gpu01", HostStatus.CLEAN, ended=True),
...                                           HostResult("gpu02", HostStatus.TIMEOUT))), "r1")
>>> load()
{'gpu02': 'r1'}
>>> begin(["gpu02"], "r2")   # its token r1 still asked for, beside r2's
>>> load()
{'gpu02': 'r1 r2'}
>>> settle(RunResult("status", 1.0, (HostResult("gpu02", HostStatus.CLEAN, ended=True,
...                                             answered=("r1",)),)))
>>> load()
{'gpu02': 'r2'}
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from fleetclean.models import RunResult
from fleetclean.results.statefile import read_hosts, update_hosts

FILE = "unheard.json"
# A note older than this is dropped: the host may have left the fleet.
KEEP_S = 30 * 24 * 3600
# Tokens a host keeps at most (the newest): lib.sh keeps as many "heard" journals.
KEEP = 8

Notes = dict[str, list[tuple[str, float]]]


def token() -> str:
    """A teardown's token: random, so that no other run's journal matches it."""
    return os.urandom(6).hex()


def load(now: float | None = None) -> dict[str, str]:
    """``{host: "token token ..."}`` of the hosts with a teardown from here not heard to
    the end, as ``FC_UNHEARD`` takes them; empty where the file is missing or unreadable."""
    notes = _notes(read_hosts(FILE), now)
    return {h: " ".join(t for t, _ in tokens) for h, tokens in notes.items()}


def begin(hosts: Iterable[str], run: str, now: float | None = None) -> None:
    """Note every host of the teardown ``run`` as not heard yet, beside the tokens it
    has (its script asks for them)."""
    at = time.time() if now is None else now
    names = list(hosts)

    def change(notes: Notes) -> None:
        for host in names:
            notes[host] = [*notes.get(host, []), (run, at)][-KEEP:]

    _update(change, now)


def settle(result: RunResult, run: str = "", now: float | None = None) -> None:
    """Forget what ``result`` settled: each token a host's node answered for, and the
    teardown ``run``'s own where the host's script was heard to its end."""
    done = {h.host: (set(h.answered) | ({run} if run and h.ended else set()))
            for h in result.hosts if h.answered or (run and h.ended)}
    if not done:
        return

    def change(notes: Notes) -> None:
        for host, tokens in done.items():
            left = [(t, at) for t, at in notes.get(host, []) if t not in tokens]
            if left:
                notes[host] = left
            else:
                notes.pop(host, None)

    _update(change, now)


def _update(change: Callable[[Notes], None], now: float | None) -> None:
    def apply(hosts: dict[str, Any]) -> dict[str, Any]:
        notes = _notes(hosts, now)
        change(notes)
        return {h: [[t, at] for t, at in tokens] for h, tokens in notes.items()}

    update_hosts(FILE, apply)


def _notes(hosts: dict[str, Any], now: float | None) -> Notes:
    """The file's hosts as notes, each token well formed and younger than KEEP_S."""
    now = time.time() if now is None else now
    notes: Notes = {}
    for host, tokens in hosts.items():
        kept = []
        for note in tokens if isinstance(tokens, list) else ():
            try:
                run, at = str(note[0]), float(note[1])
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):
                continue
            if run.isalnum() and run.isascii() and math.isfinite(at) and now - at < KEEP_S:
                kept.append((run, at))
        if kept:
            notes[str(host)] = kept[-KEEP:]
    return notes
