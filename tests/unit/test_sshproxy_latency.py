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
    # "b" comes half a delay after "a": it must leave one delay after it came, not after
    # "a"'s wait has run out (a relay that sleeps before each write gives it 1.5 delays).
    late = 1.0
    far, src = socket.socketpair()
    dst, near = socket.socketpair()
    threading.Thread(target=relay_late, args=(src, dst, late), daemon=True).start()
    near.settimeout(5)
    far.sendall(b"a")
    time.sleep(late / 2)
    sent_b = time.monotonic()
    far.sendall(b"b")
    far.shutdown(socket.SHUT_WR)
    got = _read_until_eof(near)
    arrived_b = next(t for t, data in got if b"b" in data)
    assert late <= arrived_b - sent_b < 1.3 * late
    for sock in (far, src, dst, near):
        sock.close()


def test_an_end_of_writing_leaves_the_other_way_open() -> None:
    # A client that sends its request, then its EOF, still hears the server's answer.
    client, proxy_near = socket.socketpair()
    proxy_far, server = socket.socketpair()
    for args in ((proxy_near, proxy_far, LATE), (proxy_far, proxy_near, LATE)):
        threading.Thread(target=relay_late, args=args, daemon=True).start()
    client.sendall(b"request")
    client.shutdown(socket.SHUT_WR)
    server.settimeout(5)
    assert b"".join(data for _, data in _read_until_eof(server)) == b"request"
    server.sendall(b"answer")
    server.shutdown(socket.SHUT_WR)
    client.settimeout(5)
    assert b"".join(data for _, data in _read_until_eof(client)) == b"answer"
    for sock in (client, proxy_near, proxy_far, server):
        sock.close()
