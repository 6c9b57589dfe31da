"""Pacing new connections to one sshd, and backing off from the ones it drops.

sshd counts a connection as a *startup* from the moment it accepts it until the client has
authenticated, and past ``MaxStartups`` (OpenSSH's default ``10:30:100``: from 10 startups on
it drops 30% of new connections, rising to all of them at 100) it writes "Exceeded
MaxStartups" and closes the connection before its banner. ``MaxSessions`` (default 10) is
another matter: it counts shell/exec/subsystem channels on one connection, never a
``direct-tcpip`` channel through a jump host (sshd's session.c allocates a session only for
a "session" channel), so a shared bastion connection carries any number of hosts.

One run opens one connection per target host, so a target never sees more than one startup
from it; a jump host reached through its own ``ProxyCommand`` (``ssh -W %h:%p bastion``) sees
one per target. So every connection waits for a *slot* of its sshd before it starts: at most
``START_LIMIT`` (below OpenSSH's 10) at once, and half as many each time that sshd drops one
anyway (others connect to it too, or its MaxStartups is lower).

>>> gate = Startups(limit=2)
>>> with gate.slot("bastion"):
...     gate.active("bastion")
1
>>> gate.dropped("bastion"); gate.limit("bastion")
1
>>> [round(backoff(n, jitter=0.0), 2) for n in range(1, 6)]
[0.2, 0.4, 0.8, 1.6, 2.0]
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

START_LIMIT = 8
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 2.0


def backoff(attempt: int, jitter: float = 0.5) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): doubling, capped, and spread by
    up to ±``jitter`` of itself so that hosts dropped together do not come back together."""
    base = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** (attempt - 1))
    return base * (1 + jitter * (2 * random.random() - 1))


class _Gate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self.cond = threading.Condition()


class Startups:
    """Slots per sshd (a key naming it: its address and port, or the ProxyCommand that
    reaches it), each key with its own limit."""

    def __init__(self, limit: int = START_LIMIT) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._gates: dict[object, _Gate] = {}

    def _gate(self, key: object) -> _Gate:
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = _Gate(self._limit)
            return gate

    @contextmanager
    def slot(self, key: object) -> Iterator[None]:
        """Hold one of ``key``'s slots: from before the TCP connect to after authentication."""
        gate = self._gate(key)
        with gate.cond:
            while gate.active >= gate.limit:
                gate.cond.wait()
            gate.active += 1
        try:
            yield
        finally:
            with gate.cond:
                gate.active -= 1
                gate.cond.notify()

    def dropped(self, key: object) -> None:
        """``key``'s sshd dropped a connection before its banner: fewer at once from now."""
        gate = self._gate(key)
        with gate.cond:
            gate.limit = max(1, gate.limit // 2)

    def limit(self, key: object) -> int:
        return self._gate(key).limit

    def active(self, key: object) -> int:
        return self._gate(key).active
