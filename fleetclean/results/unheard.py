"""Which hosts ran a teardown from this controller whose end it did not hear: their next
run asks the node for what that teardown did.

A teardown that loses its controller with an error (SIGPIPE, SIGHUP) knows it, and tells
the host's next run by itself (lib.sh: the journal). One whose connection stalls without
an error cannot know: a network that drops silently while sshd still takes the output, or
a controller stopped, then killed, with the output waiting in its socket. It finishes,
believes it was heard, and keeps its journal as "heard", marked with its run's token
(:func:`token`, ``FC_RUN``). The controller notes every host of a teardown with that token
before the first connection (:func:`begin`: a controller killed mid-run leaves them so),
and forgets each host it heard to the end (:func:`end`); a host it did not hear keeps the
token, which the host's next run passes on (``FC_UNHEARD``), and the node sends that
journal back once.

Kept in ``$FLEETCLEAN_STATE_DIR/unheard.json``, each host with its token and when it was
noted; after 30 days a note is dropped. A lost update (two runs at once) costs at most
one telling.

>>> import os, tempfile
>>> from fleetclean.models import HostResult, HostStatus, RunResult
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> begin(["gpu01", "gpu02"], "r1")
>>> end(RunResult("post-extraction", 1.0, (HostResult("gpu01", HostStatus.CLEAN),
...                                        HostResult("gpu02", HostStatus.TIMEOUT))))
>>> load()
{'gpu02': 'r1'}
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from fleetclean.models import RunResult
from fleetclean.results.statefile import read_hosts, write_hosts

FILE = "unheard.json"
# A note older than this is dropped: the host may have left the fleet, and its node has
# most likely run another teardown since.
KEEP_S = 30 * 24 * 3600


def token() -> str:
    """A teardown's token: random, so that no other run's journal matches it."""
    return os.urandom(6).hex()


def load(now: float | None = None) -> dict[str, str]:
    """``{host: token}`` of the hosts whose last teardown from here was not heard to the
    end; empty where the file is missing or unreadable."""
    return {h: t for h, (t, _) in _read(now).items()}


def begin(hosts: Iterable[str], run: str, now: float | None = None) -> None:
    """Note every host of the teardown ``run`` as not heard yet (the token each had is
    in its script already: that teardown's start sends the journal it asks for)."""
    now = time.time() if now is None else now
    notes = _read(now)
    notes.update({h: (run, now) for h in hosts})
    write_hosts(FILE, notes)


def end(result: RunResult, now: float | None = None) -> None:
    """Forget the hosts of ``result`` whose script was heard to its end (the host clean,
    dirty or faulty): every other one keeps its token."""
    notes = _read(now)
    heard = [h.host for h in result.hosts if not h.status.failed and h.host in notes]
    if heard:
        for host in heard:
            del notes[host]
        write_hosts(FILE, notes)


def _read(now: float | None) -> dict[str, tuple[str, float]]:
    now = time.time() if now is None else now
    notes: dict[str, tuple[str, float]] = {}
    for host, note in read_hosts(FILE).items():
        try:
            run, at = str(note[0]), float(note[1])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if run.isalnum() and now - at < KEEP_S:
            notes[str(host)] = (run, at)
    return notes
