"""This machine's network addresses, for ssh_config's ``Match localnetwork``.

``Match !localnetwork 10.0.0.0/8`` + ``ProxyJump offsite-bastion`` is how a laptop goes
through the bastion only when it is off-site. paramiko does not know the criterion and
takes the block as matching (https://github.com/paramiko/paramiko/issues/2632), negated
or not: every host went through the bastion, on site too. OpenSSH judges it
by the addresses of this machine's interfaces (``getifaddrs``), which are read here the
same way, once a run.

>>> in_networks("10.1.2.3/8,192.168.0.0/16", [ipaddress.ip_address("192.168.4.9")])
True
>>> in_networks("10.0.0.0/8", [ipaddress.ip_address("172.16.0.1")])
False
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import ipaddress
import socket
import sys
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [  # struct ifaddrs: the same first five fields on Linux and the BSDs
    ("ifa_next", ctypes.POINTER(_IfAddrs)),
    ("ifa_name", ctypes.c_char_p),
    ("ifa_flags", ctypes.c_uint),
    ("ifa_addr", ctypes.c_void_p),
    ("ifa_netmask", ctypes.c_void_p),
]


def _family(sockaddr: int) -> int:
    # Linux's sockaddr starts with a 16-bit family; the BSDs' and macOS's with a length
    # byte, then an 8-bit family.
    if sys.platform.startswith("linux"):
        return ctypes.c_uint16.from_address(sockaddr).value
    return ctypes.c_uint8.from_address(sockaddr + 1).value


@functools.cache
def addresses() -> tuple[Address, ...]:
    """Every address of this machine's interfaces (IPv4 and IPv6); () where they cannot
    be read."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return ()
    found: list[Address] = []
    try:
        node = head
        while node:
            entry = node.contents
            if entry.ifa_addr:
                family = _family(entry.ifa_addr)
                if family == socket.AF_INET:  # sockaddr_in: the address at offset 4
                    raw = ctypes.string_at(entry.ifa_addr + 4, 4)
                    found.append(ipaddress.IPv4Address(raw))
                elif family == socket.AF_INET6:  # sockaddr_in6: the address at offset 8
                    raw = ctypes.string_at(entry.ifa_addr + 8, 16)
                    found.append(ipaddress.IPv6Address(raw))
            node = entry.ifa_next
    finally:
        libc.freeifaddrs(head)
    return tuple(found)


def in_networks(networks: str, local: Iterable[Address] | None = None) -> bool:
    """Whether an address of this machine (``local``) is in one of ``networks`` (a comma
    list of CIDR blocks, as ``Match localnetwork`` takes); a block that does not parse
    matches nothing, as in ssh."""
    mine = tuple(addresses() if local is None else local)
    for text in networks.split(","):
        try:
            network = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            continue
        if any(address.version == network.version and address in network
               for address in mine):
            return True
    return False
