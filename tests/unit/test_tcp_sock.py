"""``TcpSock`` (transport/upstream.py): the socket fleetclean hands paramiko. Nagle's
algorithm is off on a TCP connection, reads come back whole whatever their sizes, and a
socket that is not TCP (a jump host's channel is not a socket at all; a test's socketpair)
is taken as it is."""

from __future__ import annotations

import socket
import threading

from fleetclean.transport.upstream import TcpSock


def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname(), timeout=5)
        peer, _ = server.accept()
    peer.settimeout(5)  # a regression fails the test rather than hanging it
    return client, peer


def test_nagle_is_off_and_small_reads_add_up_to_what_was_sent() -> None:
    client, peer = _loopback_pair()
    assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    sock = TcpSock(client)
    try:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        sent = [b"SSH-2.0-x\r\n", b"a" * 20000, b"tail"]

        def write() -> None:
            for part in sent:
                peer.sendall(part)
            peer.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=write)
        writer.start()
        got = b""
        while chunk := sock.recv(7):  # paramiko's reads are as small as a packet's length
            assert len(chunk) <= 7
            got += chunk
        writer.join()
        assert got == b"".join(sent)
    finally:
        sock.close()
        peer.close()


def test_a_socket_that_is_not_tcp_is_used_as_it_is() -> None:
    a, b = socket.socketpair()
    a.settimeout(5)
    sock = TcpSock(a)
    try:
        b.sendall(b"hello")
        assert sock.recv(5) == b"hello"
    finally:
        sock.close()
        b.close()
