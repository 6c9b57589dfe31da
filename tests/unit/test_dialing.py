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
        self.steps: list[Callable[[], object] | None] = []  # None: end the thread
        self.go, self.ran = threading.Semaphore(0), threading.Semaphore(0)
        self.probe: Callable[[], str | None] = lambda: None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.do(lambda: setattr(self, "probe", dialing.probe()))

    def _run(self) -> None:
        while True:
            self.go.acquire()
            step = self.steps.pop(0)
            if step is None:
                return
            step()
            self.ran.release()

    def do(self, step: Callable[[], object]) -> None:
        self.steps.append(step)
        self.go.release()
        assert self.ran.acquire(timeout=10)

    def stop(self) -> None:
        self.do(dialing.done)
        self.steps.append(None)
        self.go.release()
        self.thread.join(timeout=10)


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
    worker.stop()
    assert worker.probe() is None


def test_a_probe_kept_after_its_host_is_done_does_not_show_the_next_host() -> None:
    worker = Worker()
    first = worker.probe
    worker.do(noting(dialing.SLOT))
    worker.do(dialing.done)
    worker.do(lambda: setattr(worker, "probe", dialing.probe()))  # the thread's next host
    worker.do(noting(Phase.TCP.value))
    assert (first(), worker.probe()) == (None, "TCP connect")
    worker.stop()


def test_a_jump_hosts_own_steps_are_not_the_hosts() -> None:
    worker = Worker()
    hop = dialing.via_hop()
    worker.do(hop.__enter__)
    worker.do(lambda: dialing.note(connection(transport(True, False, False))))
    assert worker.probe() == "connecting to the jump host"
    worker.do(lambda: hop.__exit__(None, None, None))
    worker.do(lambda: dialing.note(connection(transport(True, True, False))))
    assert worker.probe() == "authentication"
    worker.stop()


def test_one_hosts_steps_are_not_another_threads() -> None:
    a, b = Worker(), Worker()
    a.do(lambda: dialing.note(dialing.SLOT))
    assert (a.probe(), b.probe()) == ("waiting for a startup slot", None)
    a.stop()
    b.stop()


def test_every_connection_phase_and_step_has_words() -> None:
    probe = dialing.probe()
    steps = [p.value for p in set(Phase) - {Phase.SCRIPT}] + [
        dialing.SLOT, dialing.RETRY, dialing.HOP, dialing.THROUGH, dialing.PROXY]
    try:
        for step in steps:
            dialing.note(step)
            words = probe()
            assert words and words != step, step
    finally:
        dialing.done()
