"""How far each host's connection has got, for the live view: while a host is connecting,
its worker thread notes each step (waiting for a startup slot of a busy sshd or bastion,
the TCP connect, then the connection, whose SSH phase is read off paramiko's transport),
and the view asks a few times a second, for each host still connecting (at most --forks). At
1,000 hosts a run that hangs shows where: sshd slow to authenticate (PAM, LDAP), silent
after its banner, or fleetclean pacing its own new connections.

Keyed by thread, because a host is dialed start to finish on one worker thread: nothing is
passed down through the connection code's layers, a step costs one dict write, and reading
it costs the view, not the host.

>>> where = probe(); note("slot"); where()
'waiting for a startup slot'
>>> done(); where() is None
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SLOT = "slot"  # waiting for a startup slot of the sshd (pace.Startups)
RETRY = "retry"  # dropped before its banner (MaxStartups), or its jump host lost: a pause
HOP = "hop"  # connecting to a jump host on the way
THROUGH = "through"  # the jump host opening its channel to the host
PROXY = "proxy"  # starting the ProxyCommand

# The connection phases by their classify.Phase values (a test holds the two together):
# classify imports paramiko, which a local run never loads.
_WORDS = {
    SLOT: "waiting for a startup slot",
    RETRY: "dropped, trying again",
    HOP: "connecting to the jump host",
    THROUGH: "through the jump host",
    PROXY: "starting the ProxyCommand",
    "tcp": "TCP connect",
    "banner": "waiting for the SSH banner",
    "kex": "key exchange",
    "auth": "authentication",
    "channel": "opening the session",
}

# thread ident -> a step (str) or the fabric Connection being opened. A thread writes only
# its own entries; dict get/set/pop are atomic under the GIL.
_NOTES: dict[int, Any] = {}
_HOPS: dict[int, int] = {}  # thread ident -> jump-host connections it is inside
# thread ident -> the token of the probe given out for its current host: a probe kept after
# its host finished answers None, not the next host's steps on the same thread.
_OWNER: dict[int, object] = {}


def note(step: Any) -> None:
    """The calling thread's host is at ``step``: SLOT, a ``Phase`` value, or the fabric
    ``Connection`` it is opening (its phase is then read when asked). Not while it connects
    to a jump host: those steps are the jump host's, not the host's (:func:`via_hop`)."""
    ident = threading.get_ident()
    if not _HOPS.get(ident):
        _NOTES[ident] = step


@contextmanager
def via_hop() -> Iterator[None]:
    """The calling thread connects to a jump host on its host's way: shown as such, its
    own steps kept out."""
    note(HOP)
    ident = threading.get_ident()
    _HOPS[ident] = _HOPS.get(ident, 0) + 1
    try:
        yield
    finally:
        if _HOPS[ident] == 1:
            del _HOPS[ident]
        else:
            _HOPS[ident] -= 1


def done() -> None:
    """The calling thread's host is done (connected and run, or gave up): nothing to show,
    and its probe answers None from now on."""
    ident = threading.get_ident()
    _NOTES.pop(ident, None)
    _OWNER.pop(ident, None)


def probe() -> Callable[[], str | None]:
    """Where the calling thread's host is, in words, readable from any thread (None: no
    step noted, as for a local host, or the host is done)."""
    ident = threading.get_ident()
    token = _OWNER[ident] = object()

    def where() -> str | None:
        step = _NOTES.get(ident)
        if step is None or _OWNER.get(ident) is not token:
            return None
        if not isinstance(step, str):
            from fleetclean.transport.classify import phase_of  # loaded by the connection

            try:
                step = phase_of(step.client.get_transport()).value
            except Exception:  # a connection its worker is tearing down meanwhile
                return None
        return _WORDS.get(step, step)

    return where
