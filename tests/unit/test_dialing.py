"""How far a host's connection got, as the live view reads it from another thread: each
step its worker notes, the SSH phase read off the connection's transport, a jump host's
own steps kept out, nothing left once the host is done (fake transports, no SSH)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fleetclean.transport import dialing
from fleetclean.transport.classify import Phase


def transport(banner: bool, kex: bool, authenticated: bool) -> Any:
    return SimpleNamespace(remote_version="SSH-2.0-OpenSSH_9.6" if banner else "",
                           session_id=b"id" if kex else None,
                           is_authenticated=lambda: authenticated)


def connection(t: Any) -> Any:
    return SimpleNamespace(client=SimpleNamespace(get_transport=lambda: t))


class Worker:
    """A thread that runs each step it is given, then waits for the next: a host's
    worker thread, which the test drives one step at a time."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], object]] = []
        self.go, self.ran = threading.Semaphore(0), threading.Semaphore(0)
        self.probe: Callable[[], str | None] = lambda: None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.do(lambda: setattr(self, "probe", dialing.probe()))

    def _run(self) -> None:
        while True:
            self.go.acquire()
            self.steps.pop(0)()
            self.ran.release()

    def do(self, step: Callable[[], object]) -> None:
        self.steps.append(step)
        self.go.release()
        assert self.ran.acquire(timeout=10)


def noting(step: object) -> Callable[[], None]:
    return lambda: dialing.note(step)


def test_each_step_and_phase_is_read_from_another_thread() -> None:
    worker = Worker()
    shown = []
    for step in (dialing.SLOT, Phase.TCP.value,
                 connection(None), connection(transport(True, False, False)),
                 connection(transport(True, True, False)),
                 connection(transport(True, True, True))):
        worker.do(noting(step))
        shown.append(worker.probe())
    assert shown == ["waiting for a startup slot", "TCP connect", "waiting for the SSH banner",
                     "key exchange", "authentication", "opening the session"]
    worker.do(dialing.done)
    assert worker.probe() is None


def test_a_jump_hosts_own_steps_are_not_the_hosts() -> None:
    worker = Worker()
    hop = dialing.via_hop()
    worker.do(hop.__enter__)
    worker.do(lambda: dialing.note(connection(transport(True, False, False))))
    assert worker.probe() == "connecting to the jump host"
    worker.do(lambda: hop.__exit__(None, None, None))
    worker.do(lambda: dialing.note(connection(transport(True, True, False))))
    assert worker.probe() == "authentication"
    worker.do(dialing.done)


def test_one_hosts_steps_are_not_another_threads() -> None:
    a, b = Worker(), Worker()
    a.do(lambda: dialing.note(dialing.SLOT))
    assert (a.probe(), b.probe()) == ("waiting for a startup slot", None)
    a.do(dialing.done)


def test_every_connection_phase_has_words() -> None:
    probe = dialing.probe()
    for phase in set(Phase) - {Phase.SCRIPT}:
        dialing.note(phase.value)
        words = probe()
        assert words and words != phase.value, phase
    dialing.done()
