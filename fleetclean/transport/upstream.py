"""fabric's and paramiko's weak spots, and what fleetclean does about each: all in one place.

Each is kept (fleetclean still runs on fabric and paramiko) and worked around here or, where
the fix belongs to another module's job, at the place named:

- fabric's ``Connection`` turns every attribute it sets on itself in ``__init__``
  (``inline_ssh_env``) into a write to the ``Config`` it was given, and every such write
  re-merges that config from empty (invoke's ``DataProxy.__setattr__``,
  https://github.com/pyinvoke/invoke/issues/413). Sharing one ``Config`` between threads then
  races: another thread reads it half-merged and fails with "No attribute or config key found
  for 'forward_agent' ... Valid keys: []" (seen at 32 hosts; the same symptom:
  https://github.com/scylladb/scylla-cluster-tests/issues/2187), and one ``dir()`` per
  attribute costs about 0.25 ms per connection. ``Connection`` below sets attributes plainly;
  ``shared_config`` is one empty, lazy ``Config`` for every connection of a run (no invoke
  config files read, and no ssh_config: fabric must not derive its own gateways). Its
  ssh_config is ``NoSSHConfig``: fabric looks every host up in it (``Connection.__init__``),
  and paramiko's lookup of a name in an empty config still expands its tokens
  (``getpass.getuser()``, the local host name): 50 us of the 110 us a ``Connection`` costs.
- paramiko checks each packet's MAC (ciphers other than AES-GCM) with a pure-Python byte
  loop (``util.constant_time_bytes_eq``) and builds an ``hmac`` object per packet: about 1 ms
  of controller CPU per host on a status run. ``transport`` prefers AES-GCM, whose tag
  cryptography checks in C, wherever the server offers it (OpenSSH does since 6.2).
- paramiko formats every ``SSH_MSG_DEBUG`` for its log whether or not anything logs it
  (``Transport._parse_debug``: ``util.safe_string`` builds the text byte by byte, 25 us
  unprofiled and a tenth of the transport thread's profiled CPU;
  https://github.com/paramiko/paramiko/issues/388). OpenSSH sends one on every
  publickey login (``authorized_keys:1: key options: ...``). ``transport`` makes a
  ``Transport`` that skips it unless paramiko's logger takes DEBUG.
- paramiko reads each packet with two or more ``recv`` calls of exactly the bytes it wants
  next (``Packetizer.read_all``: the first block, then the rest; 44 calls for the 22 packets
  of a status run), each a system call that lets go of the GIL and waits to get it back, among
  every other host's threads (https://github.com/paramiko/paramiko/issues/1105: no read
  buffer to size). ``TcpSock`` reads what the kernel has (up to ``RECV_CHUNK``)
  and hands paramiko its bytes from that.
- paramiko sets no socket option on the socket it is given, and sshd sets TCP_NODELAY only
  for an interactive session (https://bugzilla.mindrot.org/show_bug.cgi?id=3768), not for
  the ``exec`` fleetclean runs. Either side's Nagle algorithm then holds a small packet
  back until the other side acknowledges the last one, and Linux delays that ACK by 40 ms
  when it has nothing to send: the two stalls of every connection measured here were the
  publickey auth (paramiko's two small writes: 50 ms where 7 would do) and the session's
  opening (sshd's reply behind its own unacknowledged packet: 43 ms where 1 would do),
  with more of the same whenever a node's records came in small writes. ``TcpSock`` turns
  Nagle off on fleetclean's side and, on Linux, asks for an immediate ACK after each read
  (``TCP_QUICKACK``, which the kernel drops again by itself), so that sshd's Nagle waits
  for nothing: the connection and the first command took 28-38 ms on a simulated node
  instead of 66-81 ms with Nagle off alone and 111-160 ms with neither.
- paramiko bounds a connection's first key exchange (``handshake_timeout``) with a
  ``threading.Timer``: one more thread started for every connection, whose start waits for
  the new thread to run (a GIL hand-off, two on a busy controller), cancelled again after
  every packet the transport thread reads (``complete_handshake``: an ``Event.set`` each),
  and kept, done, for as long as the connection is (about 4 KB with its two ``Event``
  objects; the timer thread's own reliability was doubted upstream in
  https://github.com/paramiko/paramiko/issues/612). ``_Packetizer`` keeps the limit as a
  deadline, read where paramiko reads its timer: 5-11% of a status run's controller CPU a
  host (64 hosts, in-process, paired runs), and one thread fewer per connection in its
  handshake.
- a closed paramiko ``Transport`` is freed only by Python's cyclic garbage collector, not
  when its last reference goes: it holds its own bound methods (``_handler_table``) and
  the exception that ended its thread holds that thread's frames (``saved_exception``, an
  ``EOFError`` once the socket is closed). A full collection comes rarely (the objects of
  a run are few next to those of the imports), so every finished host's transport stayed,
  with its packetizer, socket wrapper, channels and cipher contexts: about 25 KB a host,
  one collection in a whole 256-host run (issue #18). ``_Transport.run`` breaks those
  cycles once its thread is done, so reference counting frees a transport as soon as its
  host is. A connection kept open between refreshes (``status --watch``) held
  ``TcpSock``'s last chunk read for as long as it was kept: ``TcpSock`` lets go of each
  chunk once served.
- paramiko's transport thread wakes every 0.1 s (``Transport._active_check_timeout``,
  https://github.com/paramiko/paramiko/issues/361) to look at its own state: 0.55 ms of CPU
  per second per open connection, so 2-3 ms per host of a teardown whose script runs a few
  seconds, and more than half a core for 1,000 connections that ``status --watch`` keeps
  between refreshes. Data wakes the thread at once whatever the interval, and the interval
  only bounds how late it sees that it was closed (``close`` does not wait for it): so once a
  connection is open ``running`` makes it ``RUN_POLL_S``, and ``idle`` ``IDLE_POLL_S`` while
  a kept connection waits for the next refresh. The handshake keeps paramiko's 0.1 s, which
  its banner and auth timeouts are checked on. A closed connection's thread would then
  linger up to that long (one more thread per host closed in the last half second), so
  ``TcpSock.close`` shuts the socket down first: the thread's ``recv`` returns at once.
- paramiko's ``SSHConfig.lookup`` expands every token of every matching block again on each
  call (``getpass.getuser()``, ``os.environ``: about 40 such calls for each host behind a
  jump host, whose hops are looked up per host). ``SSHConfig`` keeps each name's answer.
  Each lookup also walks every block of the file and calls ``getpass.getuser()`` for each
  (``_does_match``, even for a block with no ``Match``): with one ``Host`` block per node
  (a generated config, the simulator's) that is O(hosts) per host, 8.6 ms per host at 64
  and ten times that at 1,000. ``SSHConfig`` looks a name up in a view holding only the
  blocks that can apply to it: those whose ``Host`` is that literal name, and every block
  with a pattern or a ``Match``, in file order.
  It also expands ProxyCommand's ``%p`` to the config's ``Port`` (or 22) even where the
  inventory's ``ansible_port`` says otherwise (https://github.com/paramiko/paramiko/issues/1321)
  and knows no ``%n``: ``SSHConfig`` leaves
  ProxyCommand's tokens to ``hops.expand``, which knows the host, port and user in the end.
  And its lookup takes no login user: ``Match user`` is judged with the config's ``User``
  so far, else the local user, where ssh judges it with ``-l``'s (Ansible's ``-o User=``,
  the inventory's user; https://github.com/paramiko/paramiko/issues/1895):
  ``SSHConfig.lookup(name, user=...)`` sets it first, as ssh does.
- paramiko's ``HostKeys`` scans every known_hosts entry on each lookup and each add: O(hosts)
  per connection, O(hosts²) to load a fleet's known_hosts, each hashed entry's salt and hash
  decoded and encoded again at every lookup; and it keeps one key a host and type, where
  ssh takes a host whose key any line lists. ``IndexedHostKeys`` looks plain names up in a
  dict, checks hashed ones with their salts decoded once, and keeps every key listed.
- paramiko's ``ProxyCommand`` spins at 100% CPU once the command has exited (``recv`` loops on
  EOF, https://github.com/paramiko/paramiko/issues/1277), never reaps it
  (https://github.com/paramiko/paramiko/issues/1713), leaves its three pipes open
  (https://github.com/paramiko/paramiko/issues/1715) and throws its stderr away, the only
  place that says why the proxy failed. ``ProxySock`` replaces it.
- paramiko's ``Channel.send`` checks ``closed`` under its lock but sends after releasing it
  (seen: sshd dropped a shared bastion, and every host behind it). ``HopSocket`` serializes.
- a gateway derived from ssh_config opens one bastion connection per target
  (https://github.com/paramiko/paramiko/issues/664), ``open_gateway`` has no timeout
  (https://github.com/fabric/fabric/issues/2197), multi-hop is broken
  (https://github.com/fabric/fabric/issues/2203, https://github.com/fabric/fabric/issues/1935):
  ``pool`` opens its own connection per hop chain, each channel with a timeout, each hop a
  ``Connection`` whose ``sock`` is a channel through the previous one.
- ``ProxyJump none`` is read as a host called "none"
  (https://github.com/fabric/fabric/issues/2354): ``hops.resolve`` drops it.
- paramiko's agent is always ``$SSH_AUTH_SOCK``'s (``Agent()``; ``IdentityAgent`` is not
  read, https://github.com/paramiko/paramiko/issues/2315), so a laptop whose keys live in
  1Password's, Secretive's or gpg-agent's agent (``IdentityAgent ~/.1password/agent.sock``
  in ~/.ssh/config) failed to log in where ``ssh`` succeeds. ``agent_for`` reads the
  option as ssh does and gives ``SocketAgent``, which ``connect`` hands the client before
  it authenticates (``SSHClient`` makes its own only where ``_agent`` is None).
- ``Connection`` trusts unknown host keys (``AutoAddPolicy``): ``hostkeys.apply`` puts
  fleetclean's policy on every connection and hop.
- paramiko's ``SSHClient`` names a host's key by the host and port it connects to, with no
  way to give ssh_config's ``HostKeyAlias`` (https://github.com/paramiko/paramiko/pull/2217,
  open): ``hostkeys.apply`` hands its lookup and its policy the alias instead.
- paramiko does not verify host certificates (https://github.com/paramiko/paramiko/issues/771,
  https://github.com/paramiko/paramiko/issues/2277): its ``HostKeys`` reads no
  ``@cert-authority`` or ``@revoked`` line of known_hosts; it negotiates
  ``*-cert-v01@openssh.com`` host keys, but after the plain ones (``preferred_keys``), so
  an sshd with a ``HostCertificate`` shows its plain key; and where a server shows a
  certificate, paramiko takes the key out of it (``PKey._check_type_and_load_cert``)
  and checks neither its CA, nor its host names, nor its dates. A site whose known_hosts
  vouches for its nodes by one CA line (HPC centres; Vault, step-ca, Teleport) had every
  node an "unknown host key" where ``ssh node07`` works. ``hostkeys.KnownHosts`` keeps
  those lines and judges every key of a host they name, as ssh's ``check_host_key``
  (``hostcerts``: the certificate read and checked as OpenSSH's ``cert_parse`` and
  ``sshkey_cert_check_host``); ``transport(certs_first=True)``, for such a host, asks for
  certificate algorithms first, as ssh's ``order_hostkeyalgs``.
- ``Connection`` keeps ``connect_timeout`` as an int (1.5 s would be 1 s, 0.5 s none at all):
  ``connect`` sets the real figure.
- ``Connection.run`` starts up to three IO threads per command, each polling every 10 ms:
  ``stream`` keeps its own loop on the connection's transport; and since ``select()`` on a
  paramiko channel makes it open a pipe (two descriptors per host) and write to it on every
  packet, that loop waits in a blocking ``recv`` instead.
- ``ThreadingGroup`` starts one thread per host, unbounded: ``fleet`` (and ``api`` for a
  fabric ``Group``) run hosts on a pool of ``--forks`` threads.
- paramiko asks for the authentication service and waits for the answer before it sends
  a key (``AuthHandler._parse_service_accept`` signs it), one round trip a login: a
  seventh of a status's round trips, 50 ms a host from a laptop across a VPN (the
  latency of https://github.com/paramiko/paramiko/issues/738). RFC 4253 section 10 makes
  a client wait for that answer only after a key exchange with implicit server
  authentication; every key exchange paramiko offers proves the server by its signature
  (explicit), and sshd, Dropbear, libssh, Go's and AsyncSSH's servers read the two
  requests in order. So ``_Transport.auth_publickey`` signs first and sends both at once
  (``_KeyWithService``), but for a key whose signing may wait on a person or never end
  (an agent's: a touch, a confirmation; signed, as before, under the login's
  ``auth_timeout``) and an RSA key whose algorithm the server's ``server-sig-algs`` has
  not yet decided (it comes with the server's first encrypted message, most often before
  the login asks).
- importing either imports invoke, whose package imports ``unittest.mock`` (and with it
  ``asyncio``) for ``MockContext``: 25-40 ms of an SSH run's start-up
  (https://github.com/pyinvoke/invoke/issues/775, https://github.com/paramiko/paramiko/pull/2543).
  ``sshlib``, the one module that imports them, leaves it out.

>>> keys = IndexedHostKeys()
>>> keys.get("gpu01") is None
True
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hmac
import logging
import os
import re
import select
import shlex
import socket
import subprocess
import threading
import time
from typing import Any

from fleetclean.transport.sshlib import fabric, paramiko

RUN_POLL_S = 0.5
IDLE_POLL_S = 2.0
STDERR_KEPT = 2048  # bytes of a ProxyCommand's stderr kept for the failure message
RECV_CHUNK = 8192  # what TcpSock asks the kernel for at once (see TcpSock)
REAP_S = 1.0  # how long a ProxyCommand gets to exit after SIGTERM before SIGKILL


class Connection(fabric.Connection):  # type: ignore[misc]  # fabric ships no types
    """``fabric.Connection`` whose attributes are attributes, never config writes."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def shared_config() -> fabric.Config:
    """The ``Config`` every connection of one run shares (read-only from here on).

    Reading a nested value (``config.connect_kwargs``, once per ``Connection``) asks the
    config for ``_keypath`` and ``_root``, which a root config lacks: each miss builds an
    AttributeError message listing every attribute (0.1 ms). Set, they mean what their
    absence means (the root's key path is empty, the root is its own root).
    """
    config = fabric.Config(ssh_config=NoSSHConfig(), lazy=True)
    config._set(_keypath=(), _root=config)
    return config


class NoSSHConfig(paramiko.SSHConfig):
    """An empty ssh_config, looked up without paramiko's token expansion (there is nothing
    to expand): what paramiko's own lookup of an empty config answers.

    >>> dict(NoSSHConfig().lookup("gpu01"))
    {'hostname': 'gpu01'}
    """

    def lookup(self, hostname: str) -> Any:
        return paramiko.SSHConfigDict(hostname=hostname)


def running(conn: Any) -> None:
    """An open connection, in use: its thread looks at itself every ``RUN_POLL_S``."""
    _poll(conn, RUN_POLL_S)


def idle(conn: Any) -> None:
    """A kept connection, waiting for its next use: every ``IDLE_POLL_S``."""
    _poll(conn, IDLE_POLL_S)


class _Packetizer(paramiko.packet.Packetizer):
    """paramiko's packetizer with the handshake's limit kept as a deadline, not a thread (see
    the module's list). paramiko reads the limit where this does (``handshake_timed_out``,
    before each read of the socket, which times out every 0.1 s while the handshake runs)
    and, as here, only for a connection's first handshake.

    >>> threads, sock = threading.active_count(), socket.socket()
    >>> p = _Packetizer(sock); p.start_handshake(0.0)
    >>> p.handshake_timed_out(), threading.active_count() - threads
    (True, 0)
    >>> p.complete_handshake(); p.handshake_timed_out()
    False
    >>> p.start_handshake(0.0); p.handshake_timed_out()  # a rekey: no limit, as paramiko
    False
    >>> sock.close()
    """

    _deadline: float | None = None
    _begun = False

    def start_handshake(self, timeout: float) -> None:
        if not self._begun:
            self._begun = True
            self._deadline = time.monotonic() + float(timeout)

    def handshake_timed_out(self) -> bool:
        deadline = self._deadline
        return deadline is not None and time.monotonic() >= deadline

    def complete_handshake(self) -> None:
        self._deadline = None


def _poll(conn: Any, seconds: float) -> None:
    transport = conn.client.get_transport()
    if transport is not None:
        with contextlib.suppress(OSError):  # a socket already closed
            transport.sock.settimeout(seconds)


AEAD = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
CERT_SUFFIX = "-cert-v01@openssh.com"


class _KeyWithService(paramiko.auth_handler.AuthHandler):
    """paramiko's client authentication that sends a public key's signed request right
    after the request for the authentication service, not once the server has answered
    it (see the module's list); any other method, an agent's key and an RSA key the
    server has not yet said the algorithms of, as paramiko does. Its parent's members
    used here are private (paramiko 2.x-5.x), which its type stubs leave out: they are
    reached through ``own``."""

    sent = False

    def _request_auth(self) -> None:
        own: Any = self
        signed = self._signed() if own.auth_method == "publickey" else None
        self.sent = signed is not None  # before the service request: its answer may race
        own_parent: Any = super()
        own_parent._request_auth()
        if signed is not None:
            own.transport._send_message(signed)

    def _signed(self) -> paramiko.Message | None:
        """The key's USERAUTH_REQUEST (RFC 4252 section 7), signed; None for an agent's
        key (its signing is bounded only in paramiko's way) and where the algorithm would
        need the server's ``server-sig-algs``, not yet read."""
        own: Any = self
        key, user = own.private_key, own.username
        if isinstance(key, paramiko.agent.AgentKey):
            return None
        key_type, blob = own._get_key_type_and_bits(key)
        if "rsa" in key_type and "server-sig-algs" not in own.transport.server_extensions:
            return None
        algorithm = own._finalize_pubkey_algorithm(key_type)
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_USERAUTH_REQUEST)
        m.add_string(user)
        m.add_string("ssh-connection")
        m.add_string("publickey")
        m.add_boolean(True)
        m.add_string(algorithm)
        m.add_string(blob)
        session = own._get_session_blob(key, "ssh-connection", user, algorithm)
        m.add_string(key.sign_ssh_data(session, algorithm))
        return m

    def _parse_service_accept(self, m: paramiko.Message) -> None:
        if not self.sent:  # the request goes now, as in paramiko
            own_parent: Any = super()
            own_parent._parse_service_accept(m)


class _Transport(paramiko.Transport):
    # What sshd said as it ended the connection: paramiko only logs it, and its callers see
    # "transport shut down or saw EOF" whether sshd gave up on too many refused keys (it
    # says "Too many authentication failures") or its account checks ended the login.
    said = ""
    # Keys sshd answered "no" to. paramiko's SSHClient tries each key file as RSA, ECDSA and
    # Ed25519 in turn and raises the last error it met: a refused RSA key ends as "Invalid
    # key" (the Ed25519 parser's), which reads as a broken file, not a refusal.
    refused = 0
    # Host certificate algorithms before plain host keys (see the module's list).
    certs_first = False

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        keys = tuple(super().preferred_keys)
        if not self.certs_first:
            return keys
        return tuple(sorted(keys, key=lambda name: not name.endswith(CERT_SUFFIX)))

    def auth_publickey(self, username: str, key: paramiko.PKey,
                       event: Any = None) -> list[str]:
        """``Transport.auth_publickey``, its key sent with the service request
        (``_KeyWithService``)."""
        if not (self.is_active() and self.initial_kex_done):
            raise paramiko.SSHException("No existing session")
        done = event if event is not None else threading.Event()
        self.auth_handler = _KeyWithService(self)
        self.auth_handler.auth_publickey(username, key, done)
        if event is not None:
            return []
        try:
            allowed: list[str] = self.auth_handler.wait_for_response(done)
            return allowed
        except paramiko.AuthenticationException:
            if self.is_active():  # an answer; a closed connection is none
                self.refused += 1
            raise

    def _parse_disconnect(self, m: paramiko.Message) -> None:
        code, self.said = m.get_int(), m.get_text()
        self.logger.info("Disconnect (code %d): %s", code, self.said)

    def _parse_debug(self, m: paramiko.Message) -> None:
        # The message is only ever logged: unread, it is dropped as paramiko drops it.
        if self.logger.isEnabledFor(logging.DEBUG):
            super()._parse_debug(m)  # type: ignore[misc]  # private, in paramiko 2.x-5.x

    def run(self) -> None:
        try:
            super().run()
        finally:
            unlink(self)


def unlink(transport: paramiko.Transport) -> None:
    """Break the reference cycles of a transport whose thread is done (see the module's
    list), so that it is freed with its last reference. Only that thread's loop reads the
    handler table; the saved exception keeps its type and message
    (all that ``classify`` reads), not its traceback: the frames of that thread, whose
    callers' frames (``f_back``) hold the transport."""
    transport._handler_table = {}  # type: ignore[attr-defined]  # private, paramiko 2.x-5.x
    exc: BaseException | None = transport.saved_exception
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def transport(sock: Any, disabled_algorithms: Any = None,
              handshake_timeout: float | None = None,
              certs_first: bool = False) -> paramiko.Transport:
    """paramiko's ``Transport`` with AES-GCM first, the rest in paramiko's own order, that
    formats debug messages only for a log that takes them (the ``transport_factory`` of
    ``SSHClient.connect``); ``handshake_timeout``: the key exchange's limit (paramiko's
    own is 15 s); ``certs_first``: host certificates asked for before plain host keys
    (a host that a CA vouches for, see the module's list)."""
    made = _Transport(sock, disabled_algorithms=disabled_algorithms,
                      packetizer_class=_Packetizer)
    made.certs_first = certs_first
    if handshake_timeout is not None:
        made.handshake_timeout = handshake_timeout
    security = made.get_security_options()
    security.ciphers = tuple(sorted(security.ciphers, key=lambda name: name not in AEAD))
    return made


class SSHConfig(paramiko.SSHConfig):
    """``paramiko.SSHConfig`` that looks each name up once (read-only once parsed), leaves
    ProxyCommand's ``%`` tokens as written, and judges ``Match user`` with the user ssh's
    command line gives (``user``).

    >>> SSHConfig.from_text("Host *\\n  Port 22\\n  ProxyCommand ssh -W %h:%p b\\n").lookup(
    ...     "gpu01")["proxycommand"]
    'ssh -W %h:%p b'
    >>> config = SSHConfig.from_text("Match user alice\\n  Port 2201\\n")
    >>> config.lookup("gpu01", user="alice")["port"], "port" in config.lookup("gpu01")
    ('2201', False)
    """

    def __init__(self) -> None:
        super().__init__()
        self.TOKENS_BY_CONFIG_KEY = {**self.TOKENS_BY_CONFIG_KEY, "proxycommand": ["~"]}
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str | None], Any] = {}
        self._index: _Index | None = None

    def lookup(self, hostname: str, user: str | None = None) -> Any:
        """What ssh_config says for ``hostname``; ``user``: the login user of ssh's command
        line (``-l``, ``user@host``, Ansible's ``-o User=``), which ssh sets before it reads
        the config. It is the user every ``Match user`` is judged with, and ``%r``, and the
        config's ``User`` does not replace it (``ssh -G -l alice``). paramiko's lookup takes
        no user: it judges ``Match user`` with the config's ``User`` so far, else the local
        user, and ``%r`` likewise (https://github.com/paramiko/paramiko/issues/1895, #364).
        So the user goes first, as a block of its own that every host matches."""
        key = (hostname, user)
        with self._lock:
            found = self._found.get(key)
            view = None if found is not None else self._view(hostname, user)
        if found is None:
            found = paramiko.SSHConfig.lookup(view or self, hostname)
            with self._lock:
                self._found[key] = found
        return paramiko.SSHConfigDict(found)  # a copy: callers may change theirs

    def _view(self, hostname: str, user: str | None = None) -> paramiko.SSHConfig | None:
        """The blocks that can apply to ``hostname``, in file order (all of them, where
        canonicalization could look up another name), after ``user``'s; None: every block
        as it is. Under the lock."""
        # paramiko's parsed blocks: private, the same shape since paramiko 2.7.
        blocks: list[dict[str, Any]] = self._config  # type: ignore[attr-defined]
        if self._index is None:
            self._index = _block_index(blocks)
        if self._index is _NO_INDEX:
            picked = blocks
        else:
            literal, others = self._index
            picked = [blocks[i] for i in sorted({*literal.get(hostname, []), *others})]
        if user is not None:
            picked = [{"host": ["*"], "config": {"user": user}}, *picked]
        elif self._index is _NO_INDEX:
            return None
        view = paramiko.SSHConfig()
        view.TOKENS_BY_CONFIG_KEY = self.TOKENS_BY_CONFIG_KEY
        view._config = picked  # type: ignore[attr-defined]
        return view


_Index = tuple[dict[str, list[int]], list[int]]
_NO_INDEX: _Index = ({}, [])


def _block_index(blocks: list[dict[str, Any]]) -> _Index:
    """(literal host name -> its blocks, the blocks any name may match: patterns, Match);
    ``_NO_INDEX`` where a block canonicalizes host names.

    >>> _block_index([{"host": ["a"], "config": {}}, {"host": ["*"], "config": {}}])
    ({'a': [0]}, [1])
    """
    literal: dict[str, list[int]] = {}
    others: list[int] = []
    for i, block in enumerate(blocks):
        if "canonicalizehostname" in block["config"]:
            return _NO_INDEX
        hosts = block.get("host", [])
        if block.get("matches") or not hosts or any(c in h for h in hosts for c in "*?![]"):
            others.append(i)
        else:
            for name in hosts:
                literal.setdefault(name, []).append(i)
    return literal, others


class KeyTypes(dict[str, paramiko.PKey]):
    """What paramiko's client expects of a lookup: key type -> key, ``keys()`` a list."""

    def keys(self) -> list[str]:  # type: ignore[override]
        return list(super().keys())


def salted(field: str) -> tuple[bytes, bytes] | None:
    """(salt, hash) of a hashed known_hosts name, ``|1|salt|hash`` (HashKnownHosts);
    None where it is no such name or a damaged one.

    >>> salted("|1|c2FsdA==|aGFzaA==")
    (b'salt', b'hash')
    >>> salted("|1|c2FsdA") is None, salted("gpu01") is None  # damaged; no hash at all
    (True, True)
    """
    if not field.startswith("|1|"):
        return None
    salt, _, digest = field[3:].partition("|")
    try:
        return base64.b64decode(salt), base64.b64decode(digest)
    except ValueError:
        return None


def hashes_to(salt: bytes, digest: bytes, name: bytes) -> bool:
    """Whether ``name`` is the host a hashed known_hosts name (``salted``) stands for."""
    return hmac.compare_digest(hmac.digest(salt, name, "sha1"), digest)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(name: str) -> str:
    """A host name as ssh compares it: ASCII letters in lower case (its ``lowercase``);
    ``str.lower`` where it is all ASCII (the same there, and a tenth of the time)."""
    return name.lower() if name.isascii() else name.translate(_ASCII_LOWER)


class IndexedHostKeys:
    """Every known_hosts key by host name: plain names in a dict; hashed ``|1|salt|hash``
    names by the key they list, each checked with its own salt (one HMAC-SHA1, salt and
    hash decoded once). paramiko's ``HostKeys`` decodes and encodes every hashed entry
    again at every lookup; with ``HashKnownHosts yes`` (Debian's default) a fleet's keys
    are all hashed, and that was 7 ms a host at 1,024 entries. ``listed`` asks whether a
    host's key is listed: only the entries of that very key are hashed, one as a rule
    (every host has its own key). ``every`` gives every key of a host, by type (a scan of
    every hashed entry: for a key not listed, to tell a changed one from a new host). A
    host may have several keys of one type (a site's file and the user's, one of them
    stale): ssh takes it where any line lists the key it shows. Names are ASCII case-blind,
    as ssh's (``match_hostname`` lower-cases both sides): a plain name is kept, and a name
    asked for, in lower case; a hashed one is compared with the lower-cased name's hash
    (ssh hashes the name it connects to in lower case)."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, list[paramiko.PKey]]] = {}
        # key blob -> (salt, hash) of each hashed entry listing it; and every hashed entry
        self._hashed_by_key: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._hashed: list[tuple[bytes, bytes, str, paramiko.PKey]] = []
        self._seen: dict[str, dict[str, list[paramiko.PKey]]] = {}

    @property
    def hashed(self) -> bool:
        """Whether any entry's name is hashed."""
        return bool(self._hashed)

    def add(self, hostname: str, keytype: str, key: paramiko.PKey) -> None:
        if hostname.startswith("|"):
            pair = salted(hostname)
            if pair is None:  # a damaged hash names no host, as in ssh
                return
            self._hashed_by_key.setdefault(key.asbytes(), []).append(pair)
            self._hashed.append((*pair, keytype, key))
        else:
            keys = self._by_name.setdefault(ascii_lower(hostname), {}).setdefault(keytype, [])
            if key not in keys:
                keys.append(key)
        self._seen = {}

    def listed(self, hostname: str, key: paramiko.PKey) -> bool:
        """Whether a line lists ``key`` for ``hostname``."""
        hostname = ascii_lower(hostname)
        if key in self._by_name.get(hostname, {}).get(key.get_name(), ()):
            return True
        name = hostname.encode()
        return any(hashes_to(salt, digest, name)
                   for salt, digest in self._hashed_by_key.get(key.asbytes(), ()))

    def every(self, hostname: str) -> dict[str, list[paramiko.PKey]]:
        """Every key listed for ``hostname``, by type, in the order added."""
        hostname = ascii_lower(hostname)
        found = self._seen.get(hostname)
        if found is None:
            found = {kind: list(keys) for kind, keys in self._by_name.get(hostname, {}).items()}
            name = hostname.encode()
            for salt, digest, keytype, key in self._hashed:
                if hashes_to(salt, digest, name):
                    keys = found.setdefault(keytype, [])
                    if key not in keys:
                        keys.append(key)
            self._seen[hostname] = found
        return found

    def plain(self, hostname: str) -> dict[str, list[paramiko.PKey]]:
        """The keys plain (unhashed) lines list for ``hostname``, by type."""
        return self._by_name.get(ascii_lower(hostname), {})

    def lookup(self, hostname: str) -> KeyTypes | None:
        found = KeyTypes({kind: keys[-1] for kind, keys in self.every(hostname).items()})
        return found or None

    def get(self, hostname: str, default: KeyTypes | None = None) -> KeyTypes | None:
        return self.lookup(hostname) or default


def agent_for(option: str | None, tokens: Any = None,
              environ: Any = os.environ) -> str | None:
    """The agent socket ``IdentityAgent`` names, read as ssh reads it; None where that is
    paramiko's own choice (no option, or ``SSH_AUTH_SOCK``: ``$SSH_AUTH_SOCK``). ``none``
    is handled before (no agent at all, ``hops.Target.agent``). ``$NAME`` is that variable's
    value; a path has ``~`` (``~user`` too), ``${NAME}`` and the ``%`` tokens of ``tokens``
    (letter -> text: ``%d`` home, ``%u`` user, ``%i`` uid, ``%h`` host...) expanded, ``%%``
    a ``%``. An unset variable gives "": a socket that is never there (ssh stops there;
    here the host's login fails, saying so).

    >>> env = {"HOME": "/home/a", "OP": "/run/op.sock", "SSH_AUTH_SOCK": "/tmp/s"}
    >>> agent_for("SSH_AUTH_SOCK", None, env), agent_for("$OP", None, env)
    (None, '/run/op.sock')
    >>> agent_for("$NOPE", None, env), agent_for("${NOPE}/a.sock", None, env)
    ('', '')
    >>> agent_for("~/.1p/agent.sock", None, env), agent_for("${OP}.2", None, env)
    ('/home/a/.1p/agent.sock', '/run/op.sock.2')
    >>> agent_for("/run/user/%i/gnupg/S.gpg-agent.ssh", {"i": "1000"}, env)
    '/run/user/1000/gnupg/S.gpg-agent.ssh'
    """
    if option is None or option == "SSH_AUTH_SOCK":
        return None
    if option.startswith("$") and not option.startswith("${"):
        return str(environ.get(option[1:], ""))
    unset = False

    def variable(m: re.Match[str]) -> str:
        nonlocal unset
        value = environ.get(m.group(1))
        unset = unset or value is None
        return str(value or "")

    expanded = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", variable, option)
    if unset:
        return ""
    if expanded == "~" or expanded.startswith("~/"):
        expanded = str(environ.get("HOME", "~")) + expanded[1:]
    elif expanded.startswith("~"):
        expanded = os.path.expanduser(expanded)  # ~user: that user's home
    known = {"%": "%", **(tokens or {})}
    return re.sub(r"%(.)", lambda m: known.get(m.group(1), m.group(0)), expanded)


class SocketAgent:
    """What ``SSHClient`` asks of its ``_agent`` (``get_keys``, ``close``), from the agent
    at ``path``: connected at the first ask, which paramiko makes only once the identity
    files were refused. An agent that is not there has no keys, as with paramiko's own;
    ``error`` then says why, for the login's failure."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.error = ""
        self._agent: Any = None

    def get_keys(self) -> tuple[Any, ...]:
        if self._agent is None:
            self._agent = paramiko.agent.AgentSSH()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError as exc:
                sock.close()
                self.error = (f"IdentityAgent {self.path or '(an unset variable)'} cannot be "
                              f"reached: {exc.strerror or exc}")
                return ()
            self._agent._connect(sock)  # private, in paramiko 2.x-5.x: AgentSSH's own setup
        keys: tuple[Any, ...] = self._agent.get_keys()
        return keys

    def close(self) -> None:
        if self._agent is not None:
            self._agent._close()


class ProxySock:
    """A ProxyCommand's stdio as paramiko's socket: EOF is EOF, stderr kept, process reaped.

    >>> sock = ProxySock("sh -c 'echo oops >&2'")
    >>> sock.settimeout(5.0)
    >>> sock.recv(10)
    b''
    >>> sock.close()
    >>> sock.note()
    'exited 0: oops'
    """

    def __init__(self, command: str) -> None:
        self.command = command
        self._proc = subprocess.Popen(
            shlex.split(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
        )
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._in = self._proc.stdin.fileno()
        self._out = self._proc.stdout.fileno()
        self._err: int | None = self._proc.stderr.fileno()
        self._stderr = bytearray()
        self._timeout: float | None = None
        self._lock = threading.Lock()
        self._closed = False

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def send(self, data: bytes) -> int:
        try:
            return os.write(self._in, data)
        except OSError as exc:  # the command is gone: paramiko reads that as EOF
            raise OSError(errno.EPIPE, f"ProxyCommand gone: {exc.strerror}") from exc

    def recv(self, size: int) -> bytes:
        while True:
            watched = [self._out] + ([self._err] if self._err is not None else [])
            ready, _, _ = select.select(watched, [], [], self._timeout)
            if not ready:
                raise TimeoutError()  # socket.timeout, which paramiko polls on
            if self._err is not None and self._err in ready:
                self._read_stderr()
            if self._out in ready:
                return os.read(self._out, size)  # b"" at EOF: paramiko raises EOFError

    def _read_stderr(self) -> None:
        assert self._err is not None
        chunk = os.read(self._err, 4096)
        if not chunk:
            self._err = None
            return
        self._stderr += chunk
        del self._stderr[:-STDERR_KEPT]

    @property
    def closed(self) -> bool:
        return self._closed or self._proc.poll() is not None

    def note(self) -> str:
        """How the command ended and the last line it wrote on stderr ('' while it runs)."""
        code = self._proc.poll()
        if code is None:
            return ""
        lines = bytes(self._stderr).decode("utf-8", "replace").strip().splitlines()
        return f"exited {code}" + (f": {lines[-1]}" if lines else "")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()  # our own child, by PID
            try:
                self._proc.wait(REAP_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        with contextlib.suppress(OSError):
            while self._err is not None:
                self._read_stderr()
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


# Linux's; where the system has none (macOS), only Nagle is turned off.
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 0)


def _no_delay(sock: socket.socket) -> bool:
    """Nagle's algorithm off for ``sock`` (see the module's list); True where its ACKs can
    be made quick too (a TCP socket on Linux)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not a TCP socket
        return False
    return bool(_TCP_QUICKACK)


class TcpSock:
    """A connected TCP socket for paramiko: ``recv`` takes what the kernel has (up to
    ``RECV_CHUNK``) in one system call and serves paramiko's exact-size reads from it; and
    ``close`` wakes the reader thread blocked in ``recv`` on it (``shutdown`` first), so that
    the thread ends with the connection.

    Only paramiko's transport thread reads it (the handshake and then ``Transport.run``); a
    ``recv`` blocks, and times out, only when nothing it has read is left.

    8 KiB, not more: a status run's packets fit in it, and every ``recv`` allocates its
    whole size in the transport thread's malloc arena; with 64 KiB the controller's peak RSS
    grew by 19 MiB at 256 hosts (post-extraction: 97 MiB before this class, 116 with 64 KiB,
    102 with 8 KiB) and by 77 MiB at 1,000 (217 MiB, over the 150 MiB bound). A chunk whose
    bytes are all served is let go: a kept connection, idle between refreshes, holds none.

    >>> a, b = socket.socketpair()
    >>> _ = b.sendall(b"SSH-2.0-x\\r\\nrest")
    >>> b.shutdown(socket.SHUT_WR)
    >>> sock = TcpSock(a)
    >>> sock.recv(4), sock._read
    (b'SSH-', b'SSH-2.0-x\\r\\nrest')
    >>> sock.recv(100), sock._read, sock.recv(4)
    (b'2.0-x\\r\\nrest', b'', b'')
    >>> sock.close(); b.close()
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._read = b""
        self._at = 0  # what of _read paramiko has had
        self.send = sock.send
        self.settimeout = sock.settimeout
        self.getpeername = sock.getpeername
        self._quickack = _no_delay(sock)

    def recv(self, size: int) -> bytes:
        if self._at >= len(self._read):
            data = self._sock.recv(max(size, RECV_CHUNK))
            if self._quickack:
                # Linux leaves quick-ACK mode again by itself: asked for after every read.
                with contextlib.suppress(OSError):
                    self._sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
            if len(data) <= size:
                return data
            self._read, self._at = data, 0
        start = self._at
        self._at = min(start + size, len(self._read))
        data = self._read[start:self._at]
        if self._at == len(self._read):  # all served: a kept connection holds no chunk
            self._read, self._at = b"", 0
        return data

    @property
    def _closed(self) -> bool:  # what paramiko's Transport.stop_thread looks at
        return bool(getattr(self._sock, "_closed", False))

    def close(self) -> None:
        with contextlib.suppress(OSError):  # not connected any more
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


class HopSocket:
    """A channel through a jump host, used as the inner connection's socket, with send and
    close serialized (see the module's list: paramiko's ``Channel.send`` race)."""

    def __init__(self, chan: paramiko.Channel, on_close: Any = None) -> None:
        self._chan = chan
        self._lock = threading.Lock()
        self._closed = False
        self._on_close = on_close

    def send(self, data: bytes) -> int:
        with self._lock:
            if self._closed:
                raise OSError("hop channel closed")
            return self._chan.send(data)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._chan.close()
        if self._on_close is not None:
            self._on_close()

    def hop_lost(self) -> bool:
        """True when the jump host's own connection is gone (worth a retry through a new
        one), not just this channel."""
        transport = self._chan.get_transport()
        return transport is None or not transport.is_active()

    def __getattr__(self, name: str) -> Any:  # recv, settimeout, fileno, ...
        return getattr(self._chan, name)
