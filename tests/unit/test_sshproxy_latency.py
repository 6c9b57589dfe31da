"""The simulator's latency proxy (``sim fault NODE latency SECONDS``): every byte arrives
late by the same amount, in order, and the end of a stream too; what arrives meanwhile is
not held behind a wait. Real sockets (a socketpair each side), no node."""

from __future__ import annotations

import socket
import threading
import time

from fleetclean.sim.sshproxy import relay_late

LATE = 0.2


def _relay() -> tuple[socket.socket, socket.socket]:
    """(what the far side writes into, what the near side reads from), relayed LATE late."""
    far, src = socket.socketpair()
    dst, near = socket.socketpair()
    threading.Thread(target=relay_late, args=(src, dst, LATE), daemon=True).start()
    near.settimeout(5)
    return far, near


def _read_until_eof(sock: socket.socket) -> list[tuple[float, bytes]]:
    got = []
    while data := sock.recv(65536):
        got.append((time.monotonic(), data))
    return got


def test_every_chunk_arrives_late_in_order_and_so_does_the_end() -> None:
    far, near = _relay()
    sent = {}
    for word in (b"one ", b"two ", b"three"):
        sent[word] = time.monotonic()
        far.sendall(word)
        time.sleep(0.05)  # chunks apart: each keeps its own time
    far.shutdown(socket.SHUT_WR)
    got = _read_until_eof(near)
    assert b"".join(data for _, data in got) == b"one two three"
    for word, at in sent.items():
        arrived = next(t for t, data in got if word in data)
        assert arrived - at >= LATE, word  # never early: a round trip is at least its delay


def test_what_comes_meanwhile_is_not_held_behind_a_wait() -> None:
    # Ten chunks 20 ms apart, each LATE late: all of them within about LATE of the last,
    # not one LATE after another (which would be 2 s).
    far, near = _relay()
    started = time.monotonic()
    for i in range(10):
        far.sendall(b"%d " % i)
        time.sleep(0.02)
    far.shutdown(socket.SHUT_WR)
    got = _read_until_eof(near)
    assert b"".join(data for _, data in got).split() == [b"%d" % i for i in range(10)]
    assert got[-1][0] - started < 10 * LATE
