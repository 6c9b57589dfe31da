"""A TCP proxy in front of a node's sshd that answers late or stalls, as a loaded server.

Runs inside a node, started by its init as ``python3 sshproxy.py ADDRESS MODE SECONDS``:
listens on ADDRESS:22 and relays every connection to the real sshd on ADDRESS:2222, which
still does all the authenticating. Standard library only.

- ``slow-banner``: sshd's banner (its first bytes) is held back SECONDS.
- ``slow-auth``: the banner and key exchange pass at once; sshd's first answer after the
  client's NEWKEYS (the service accept that starts authentication) is held SECONDS.
- ``stall``: the banner passes, then nothing more from sshd ever does.
- ``latency``: every byte, both ways, arrives SECONDS / 2 after it was sent: a round trip
  of SECONDS, as a fleet reached from a laptop across a VPN or an ocean. The TCP handshake
  itself is the kernel's, on loopback, and is not delayed (one round trip less than a real
  network's, for every client alike).

The client's NEWKEYS is found by reading its cleartext packets (RFC 4253: uint32 length,
byte padding length, then the message number; NEWKEYS is 21), which precede encryption.

>>> c = ClientStream(); c.feed(b"SSH-2.0-x\\r\\n" + packet(20) + packet(21)); c.newkeys
True
"""

from __future__ import annotations

import contextlib
import queue
import socket
import sys
import threading
import time

INNER_PORT = 2222
NEWKEYS = 21


def packet(msg: int) -> bytes:
    """A minimal cleartext SSH packet carrying message number ``msg`` (for tests)."""
    body = bytes([4, msg]) + b"\0" * 4
    return len(body).to_bytes(4, "big") + body


class ClientStream:
    """Follows the client's bytes until its NEWKEYS message."""

    def __init__(self) -> None:
        self.buf = b""
        self.banner = False
        self.newkeys = False

    def feed(self, data: bytes) -> None:
        if self.newkeys:
            return
        self.buf += data
        if not self.banner:
            end = self.buf.find(b"\n")
            if end < 0:
                return
            self.banner, self.buf = True, self.buf[end + 1 :]
        while len(self.buf) >= 6:
            length = int.from_bytes(self.buf[:4], "big")
            if self.buf[5] == NEWKEYS:
                self.newkeys = True
                return
            if len(self.buf) < 4 + length:
                return
            self.buf = self.buf[4 + length :]


def pump_client(client: socket.socket, server: socket.socket, stream: ClientStream) -> None:
    try:
        while data := client.recv(65536):
            stream.feed(data)
            server.sendall(data)
    except OSError:
        pass
    finally:
        _shut(server)


def pump_server(
    server: socket.socket, client: socket.socket, stream: ClientStream, mode: str, delay: float
) -> None:
    first, delayed = True, False
    try:
        while data := server.recv(65536):
            if mode == "slow-banner" and first:
                time.sleep(delay)
            elif mode == "stall" and not first:
                continue  # swallowed: the client waits for ever
            elif mode == "slow-auth" and stream.newkeys and not delayed:
                time.sleep(delay)
                delayed = True
            first = False
            client.sendall(data)
    except OSError:
        pass
    finally:
        _shut(client)


def relay_late(src: socket.socket, dst: socket.socket, late: float) -> None:
    """Every chunk read from ``src`` is written to ``dst`` ``late`` seconds after it came,
    in order (a writer thread per direction, so that what arrives meanwhile is not held
    behind the wait); ``src``'s end reaches ``dst`` as late, as an end of writing only:
    what ``dst``'s side still says goes the other way (a half-closed TCP connection)."""
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def deliver() -> None:
        try:
            while True:
                due, data = chunks.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            _shut(dst)

    threading.Thread(target=deliver, daemon=True).start()
    try:
        while data := src.recv(65536):
            chunks.put((time.monotonic() + late, data))
    except OSError:
        pass
    chunks.put((time.monotonic() + late, b""))


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def serve(address: str, mode: str, delay: float) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, 22))
    listener.listen(512)
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection((address, INNER_PORT))
        except OSError:
            client.close()
            continue
        stream = ClientStream()
        pumps: tuple[tuple[object, tuple[object, ...]], ...] = (
            (pump_client, (client, server, stream)),
            (pump_server, (server, client, stream, mode, delay)),
        )
        if mode == "latency":
            pumps = ((relay_late, (client, server, delay / 2)),
                     (relay_late, (server, client, delay / 2)))
        for target, args in pumps:
            threading.Thread(target=target, args=args, daemon=True).start()  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    serve(argv[1], argv[2], float(argv[3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
