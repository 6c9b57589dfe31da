"""Run one script on one host: ``bash -s`` over SSH (paramiko), or local bash.

The only module that imports paramiko. It knows nothing of stages: it sends a script on
standard input, streams stdout lines to a callback, and returns what came back or *why
nothing could* as a ``TransportFailure`` value (never an exception), so one bad host never
hides the others.

Example::

    with Session(Options(connect_timeout=5, timeout=60)) as session:
        out = session.run(host, "echo hi")
    out.ok           # True; out.stdout == "hi\\n"
    # a host with a changed key:
    out.failure.kind  # "host_key_mismatch"; nothing was run there
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import select
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetclean.models import Host
from fleetclean.sshlib import paramiko

LineCallback = Callable[[str], None]

# paramiko logs a failed handshake from its reader thread ("Exception (client): Error
# reading SSH protocol banner" and a traceback); with no handler Python prints that on
# stderr. Every failure comes back as a TransportFailure value instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# sshd drops connections beyond MaxStartups before sending its banner; those are retried.
BANNER_RETRIES = 3
BANNER_BACKOFF_S = 0.15
# How long a finished script's channel may stay open (a background process holding it)
# before the run stops reading.
EOF_GRACE_S = 2.0


@dataclass(frozen=True)
class Options:
    connect_timeout: float = 10.0
    timeout: float = 300.0
    known_hosts: tuple[str, ...] = ()  # extra files, checked besides the host's own
    accept_new_host_keys: bool = False


@dataclass(frozen=True)
class TransportFailure:
    """Why a script did not run (or did not finish) on a host.

    kind is one of the host statuses: unreachable, auth_failed, host_key_mismatch,
    timeout, error.
    """

    kind: str
    message: str


@dataclass(frozen=True)
class ScriptOutput:
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    failure: TransportFailure | None = None
    # True when the script started on the host: a failure after that (a timeout, a cut
    # connection) may have left the host half-cleaned, and the report must say so.
    started: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:…`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _KnownHosts:
    """known_hosts files shared by all connections of one run; thread-safe for accept-new."""

    def __init__(self, files: tuple[str, ...]) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._keys = paramiko.HostKeys()
        for f in files:
            self._load(Path(f).expanduser())

    def _load(self, path: Path) -> None:
        # Line by line: paramiko's own loader gives up on the whole file at the first line
        # it cannot read (@cert-authority and @revoked markers, which it does not support,
        # or a damaged entry), and one such line must not cost every other host its key.
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return
        for line in lines:
            text = line.strip()
            if not text or text.startswith(("#", "@")):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(text)
            except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
                continue
            if entry is not None and entry.key is not None:
                for name in entry.hostnames:
                    self._keys.add(name, entry.key.get_name(), entry.key)

    @property
    def keys(self) -> paramiko.HostKeys:
        return self._keys

    def record(self, hostname: str, key: paramiko.PKey) -> None:
        """Append a newly accepted key to the first file, like OpenSSH's accept-new."""
        with self._lock:
            self._keys.add(hostname, key.get_name(), key)
            target = Path(self._files[0] if self._files else "~/.ssh/known_hosts").expanduser()
            # An unwritable file (read-only ~/.ssh, owned by root) costs the record, not the
            # run: the key stays accepted for this run.
            with contextlib.suppress(OSError):
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with target.open("a") as fh:
                    fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _Policy(paramiko.MissingHostKeyPolicy):
    def __init__(self, known: _KnownHosts, accept_new: bool) -> None:
        self._known = known
        self._accept_new = accept_new

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self._accept_new:
            raise _UnknownHostKey(hostname, key)
        self._known.record(hostname, key)


class _Bastions:
    """One SSH connection per ProxyJump bastion, shared by every host behind it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, paramiko.SSHClient] = {}

    def channel(
        self,
        spec: str,
        target: tuple[str, int],
        known: _KnownHosts,
        opts: Options,
        key: str | None,
    ) -> paramiko.Channel:
        with self._lock:
            client = self._clients.get(spec)
            if client is None or not _alive(client):
                client = _connect_bastion(spec, known, opts, key)
                self._clients[spec] = client
        transport = client.get_transport()
        assert transport is not None
        return transport.open_channel(
            "direct-tcpip", target, ("127.0.0.1", 0), timeout=opts.connect_timeout
        )

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


def _alive(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _share_host_keys(client: paramiko.SSHClient, known: _KnownHosts) -> None:
    # One parsed HostKeys for every connection of the run: parsing known_hosts once per host
    # costs controller CPU, and paramiko offers no public setter for it.
    setattr(client, "_host_keys", known.keys)  # noqa: B010


def _bastion_host(spec: str) -> Host:
    """``[user@]host[:port]`` as a Host, to word a bastion's failure."""
    user, _, rest = spec.rpartition("@")
    hostname, _, port = rest.partition(":")
    return Host(name=hostname, address=hostname, port=int(port or 22), user=user or None)


def _connect_bastion(
    spec: str, known: _KnownHosts, opts: Options, key: str | None
) -> paramiko.SSHClient:
    """Connect to a ProxyJump spec ``[user@]host[:port]``; the first host behind it lends its
    key (a bastion and its hosts usually take the same one), else agent and default keys."""
    bastion = _bastion_host(spec)
    client = paramiko.SSHClient()
    _share_host_keys(client, known)
    client.set_missing_host_key_policy(_Policy(known, opts.accept_new_host_keys))
    client.connect(
        bastion.address,
        port=bastion.port or 22,
        username=bastion.user,
        key_filename=os.path.expanduser(key) if key else None,
        timeout=opts.connect_timeout,
        banner_timeout=opts.connect_timeout,
        auth_timeout=opts.connect_timeout,
    )
    return client


class Session:
    """Shared state for one fleet run: host keys and bastion connections."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._bastions = _Bastions()
        self._known_cache: dict[tuple[str, ...], _KnownHosts] = {}
        self._keys: dict[str, paramiko.PKey | None] = {}
        self._lock = threading.Lock()
        self._open: set[paramiko.SSHClient] = set()
        self.aborted = False

    def known_for(self, host: Host) -> _KnownHosts:
        files = list(self.opts.known_hosts)
        own = host.ssh_options.get("userknownhostsfile")
        if own:
            files = own.split() + files
        if not files:
            files = ["~/.ssh/known_hosts"]
        key = tuple(files)
        with self._lock:
            known = self._known_cache.get(key)
            if known is None:
                known = _KnownHosts(key)
                self._known_cache[key] = known
            return known

    def _pkey(self, path: str) -> paramiko.PKey | None:
        """The private key at ``path``, parsed once per run (not once per host); None when
        it cannot be loaded unaided (passphrase, odd format): paramiko then loads it itself
        and reports the error for that host."""
        with self._lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(os.path.expanduser(path))
                except Exception:  # any failure: let connect() report it
                    self._keys[path] = None
            return self._keys[path]

    def abort(self) -> None:
        """Close every open connection now (a second Ctrl-C): each host's read loop sees
        its channel closed and returns; sshd hangs up on the scripts."""
        with self._lock:
            self.aborted = True
            clients = list(self._open)
        for client in clients:
            client.close()
        self._bastions.close()

    def close(self) -> None:
        self._bastions.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, host: Host, script: str, on_line: LineCallback | None = None) -> ScriptOutput:
        """Run ``script`` on ``host``; failures come back as values."""
        if host.connection == "local":
            return _run_local(host, script, self.opts, on_line)
        started = False
        try:
            with self._connect(host) as client:
                started = True
                return _run_remote(client, host, script, self.opts, on_line)
        except _Failure as exc:
            return ScriptOutput(failure=exc.failure)
        except Exception as exc:
            # Whatever else breaks (the server refusing a session channel, a socket error
            # while sending the script) is this host's failure, never the whole run's.
            where = f"{host.address}:{host.port or 22}"
            return ScriptOutput(
                failure=TransportFailure("error", f"{where}: {type(exc).__name__}: {exc}"),
                started=started,
            )

    @contextlib.contextmanager
    def _connect(self, host: Host) -> Iterator[paramiko.SSHClient]:
        opts = self.opts
        known = self.known_for(host)
        port = host.port or 22
        connect_timeout = float(host.ssh_options.get("connecttimeout", opts.connect_timeout))
        strict = host.ssh_options.get("stricthostkeychecking", "").lower()
        accept_new = opts.accept_new_host_keys or strict in ("accept-new", "no", "off")
        attempt = 0
        while True:
            attempt += 1
            client = paramiko.SSHClient()
            _share_host_keys(client, known)
            client.set_missing_host_key_policy(_Policy(known, accept_new))
            sock: socket.socket | paramiko.Channel | None = None
            started = time.monotonic()
            try:
                if host.proxy_jump:
                    sock = self._bastions.channel(
                        host.proxy_jump, (host.address, port), known, opts, host.key
                    )
                pkey = self._pkey(host.key) if host.key else None
                client.connect(
                    host.address,
                    port=port,
                    username=host.user,
                    pkey=pkey,
                    key_filename=os.path.expanduser(host.key) if host.key and not pkey else None,
                    look_for_keys=host.key is None,
                    allow_agent=host.key is None,
                    timeout=connect_timeout,
                    banner_timeout=connect_timeout,
                    auth_timeout=connect_timeout,
                    sock=sock,
                )
            except Exception as exc:
                client.close()
                failed = host
                if host.proxy_jump and sock is None:
                    # The bastion itself failed: name it, or the user checks the wrong host.
                    failed = _bastion_host(host.proxy_jump)
                failure = classify(exc, failed, time.monotonic() - started, connect_timeout)
                if failure is not None and failed is not host:
                    failure = TransportFailure(
                        failure.kind, f"ProxyJump {host.proxy_jump}: {failure.message}"
                    )
                if failure is None and attempt <= BANNER_RETRIES:
                    time.sleep(BANNER_BACKOFF_S * attempt)
                    continue
                raise _Failure(
                    failure
                    or TransportFailure(
                        "unreachable",
                        f"sshd at {host.address}:{port} closed the connection before its "
                        f"banner {attempt} times (MaxStartups?); retry with fewer --forks",
                    )
                ) from exc
            with self._lock:
                self._open.add(client)
            try:
                yield client
            finally:
                with self._lock:
                    self._open.discard(client)
                client.close()
            return


class _Failure(Exception):
    def __init__(self, failure: TransportFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def classify(
    exc: BaseException, host: Host, elapsed: float, connect_timeout: float
) -> TransportFailure | None:
    """Turn a connection error into a failure a person can act on.

    Returns None for a dropped banner that is worth retrying (sshd under load).
    """
    where = f"{host.address}:{host.port or 22}"
    if isinstance(exc, _UnknownHostKey):
        return TransportFailure(
            "host_key_mismatch",
            f"unknown host key for {exc.hostname} ({exc.key.get_name()} "
            f"{fingerprint(exc.key)}); check it, then rerun with --accept-new-host-keys "
            "or add it to known_hosts",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportFailure(
            "host_key_mismatch",
            f"host key for {where} CHANGED (now {fingerprint(exc.key)}, known "
            f"{fingerprint(exc.expected_key)}); nothing was run. If the host was "
            "reinstalled, remove the old key from known_hosts",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return TransportFailure(
            "auth_failed",
            f"authentication failed for {host.user or os.environ.get('USER', '?')}@{where} "
            f"with key {host.key or '(agent/default keys)'}: {exc}",
        )
    if isinstance(exc, paramiko.ChannelException):
        return TransportFailure(
            "unreachable", f"the bastion cannot reach {where}: {exc.text or exc}"
        )
    if isinstance(exc, FileNotFoundError) and host.key and exc.filename:
        return TransportFailure(
            "auth_failed",
            f"private key {exc.filename} not found (ansible_ssh_private_key_file or "
            "IdentityFile names a file that does not exist here)",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return TransportFailure("timeout", f"no answer from {where} within {connect_timeout:g}s")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return TransportFailure("unreachable", f"cannot connect to {where}: connection refused")
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        return TransportFailure("unreachable", f"cannot connect to {where}: {reason}")
    # A silent listener: paramiko's banner timer and its handshake timer (both set to the
    # connect timeout) race, and the loser says "No existing session" or "Negotiation failed".
    lost_race = str(exc) in ("No existing session", "Negotiation failed.")
    if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc).lower() or lost_race):
        if elapsed >= connect_timeout * 0.9:
            return TransportFailure(
                "timeout",
                f"{where} accepted TCP but sent no SSH banner within {connect_timeout:g}s",
            )
        return None
    if isinstance(exc, paramiko.SSHException):
        return TransportFailure("error", f"SSH error with {where}: {exc}")
    return TransportFailure("error", f"{where}: {type(exc).__name__}: {exc}")


def remote_command(host: Host) -> str:
    """The one command run on the host; the script itself comes on stdin, so no pattern of
    it is ever in a process's argv (the seeds' pkill killed its own shell that way)."""
    if host.become:
        user = shlex.quote(host.become_user or "root")
        return f"sudo -n -u {user} -- bash -s"
    return "bash -s"


_SUDO_PASSWORD = ("a password is required", "a terminal is required")


def _sudo_failure(stderr: str, host: Host) -> TransportFailure | None:
    if host.become and any(s in stderr for s in _SUDO_PASSWORD):
        return TransportFailure(
            "auth_failed",
            f"sudo on {host.name} wants a password; allow passwordless sudo for bash "
            "(NOPASSWD) or connect as root (ansible_user: root, ansible_become: false)",
        )
    return None


class _LineSplitter:
    """Feeds complete stdout lines to a callback as bytes arrive."""

    def __init__(self, cb: LineCallback | None) -> None:
        self._cb = cb
        self._buf = b""

    def feed(self, data: bytes) -> None:
        if self._cb is None:
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._cb(line.decode("utf-8", "replace"))


def _run_remote(
    client: paramiko.SSHClient,
    host: Host,
    script: str,
    opts: Options,
    on_line: LineCallback | None,
) -> ScriptOutput:
    transport = client.get_transport()
    assert transport is not None
    chan = transport.open_session(timeout=opts.connect_timeout)
    chan.exec_command(remote_command(host))
    chan.sendall(script.encode())
    chan.shutdown_write()
    out, err = bytearray(), bytearray()
    lines = _LineSplitter(on_line)
    deadline = time.monotonic() + opts.timeout
    status_at: float | None = None
    # select() on the channel wakes us as soon as data or the exit status arrives, instead of
    # polling with sleeps (a teardown is often over in well under a second).
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            chan.close()
            return ScriptOutput(
                out.decode("utf-8", "replace"),
                err.decode("utf-8", "replace"),
                None,
                TransportFailure(
                    "timeout",
                    f"script still running on {host.name} after --timeout {opts.timeout:g}s; "
                    "the connection was closed and the host may be half-cleaned",
                ),
                started=True,
            )
        select.select([chan], [], [], min(left, 1.0))
        got = False
        while chan.recv_ready():
            data = chan.recv(65536)
            out += data
            lines.feed(data)
            got = True
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            got = True
        # Done once sshd has sent EOF as well as the exit status: it may send the status
        # while the script's last lines are still on their way (seen under load as output
        # cut off in the middle of the verification). A process the script left in the
        # background can hold the channel open for ever, so EOF gets a few seconds, not
        # the whole --timeout.
        drained = not chan.recv_ready() and not chan.recv_stderr_ready()
        if chan.exit_status_ready() and status_at is None:
            status_at = time.monotonic()
        if drained and status_at is not None and (
            chan.eof_received or chan.closed or time.monotonic() - status_at > EOF_GRACE_S
        ):
            break
        if not got and chan.closed:
            break
        if (status_at is not None or chan.eof_received) and not got:
            # After EOF paramiko's pipe stays readable: wait on time, not on select().
            time.sleep(0.005)
    # A channel closed without an exit status reads -1 (bash killed, the connection
    # dropped); the parser then says which stage the output ended in.
    code = chan.recv_exit_status() if chan.exit_status_ready() else None
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    failure = _sudo_failure(stderr, host)
    if code is None and failure is None:
        failure = TransportFailure(
            "error", f"connection to {host.name} was cut while the script ran"
        )
    return ScriptOutput(stdout, stderr, code, failure, started=True)


def _run_local(
    host: Host, script: str, opts: Options, on_line: LineCallback | None
) -> ScriptOutput:
    argv = shlex.split(remote_command(host))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return ScriptOutput(failure=TransportFailure("error", f"cannot run {argv[0]}: {exc}"))
    lines = _LineSplitter(on_line)
    out = bytearray()
    err_chunks: list[bytes] = []
    assert proc.stdin and proc.stdout and proc.stderr
    stderr_pipe = proc.stderr

    def drain_stderr() -> None:
        err_chunks.append(stderr_pipe.read())

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    proc.stdin.write(script.encode())
    proc.stdin.close()
    deadline = time.monotonic() + opts.timeout
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()  # our own child, by PID
            proc.wait()
            return ScriptOutput(
                out.decode("utf-8", "replace"),
                b"".join(err_chunks).decode("utf-8", "replace"),
                None,
                TransportFailure("timeout", f"local script ran past --timeout {opts.timeout:g}s"),
                started=True,
            )
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            out += data
            lines.feed(data)
    code = proc.wait()
    reader.join()
    stderr = b"".join(err_chunks).decode("utf-8", "replace")
    return ScriptOutput(
        out.decode("utf-8", "replace"), stderr, code, _sudo_failure(stderr, host), started=True
    )

