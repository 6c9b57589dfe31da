"""fleetclean's host-key policy, applied to every connection and every hop.

OpenSSH's rules, not fabric's: fabric's ``Connection`` sets paramiko's ``AutoAddPolicy``,
which trusts any unknown key silently. Here an unknown key is refused with its fingerprint
unless the run accepts new keys (``--accept-new-host-keys`` or ``StrictHostKeyChecking
accept-new``), and a changed key is always refused (paramiko raises ``BadHostKeyException``
before any policy is asked).

>>> key = paramiko.Ed25519Key(data=bytes.fromhex(
...     "0000000b7373682d656432353531390000002000000000000000000000000000000000"
...     "00000000000000000000000000000000"))
>>> fingerprint(key)
'SHA256:kmYcvdi2GkPeWxB6XLjrZB8JHsy2Hm8luHMFp9GMvqk'
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from pathlib import Path

from fleetclean.transport import system
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import IndexedHostKeys

DEFAULT_FILE = "~/.ssh/known_hosts"


class UnknownHostKey(Exception):
    """A host offered a key that no known_hosts file lists, and the run accepts none."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:…`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts:
    """known_hosts files shared by all connections of one run; thread-safe for accept-new.
    ``write``: the file a newly accepted key goes to (default: the first of ``files``)."""

    def __init__(self, files: tuple[str, ...], write: str | None = None) -> None:
        self._files = files
        self._write = write
        self._lock = threading.Lock()
        self._keys = IndexedHostKeys()  # paramiko's scans every entry per lookup
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
    def keys(self) -> IndexedHostKeys:
        return self._keys

    def record(self, hostname: str, key: paramiko.PKey, hashed: bool = False) -> None:
        """Append a newly accepted key to the first file, like OpenSSH's accept-new;
        ``hashed`` (``HashKnownHosts yes``, Debian's and Ubuntu's system-wide default): the
        name written as ssh writes it then, hashed, so that the file does not list the hosts
        this user reaches."""
        with self._lock:
            self._keys.add(hostname, key.get_name(), key)
            name = paramiko.HostKeys.hash_host(hostname) if hashed else hostname
            target = Path(self._write or (self._files[0] if self._files else DEFAULT_FILE)
                          ).expanduser()
            # An unwritable file (read-only ~/.ssh, owned by root) costs the record, not the
            # run: the key stays accepted for this run.
            with contextlib.suppress(OSError):
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with target.open("a") as fh:
                    fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")


class Policy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or record them when the run accepts new ones."""

    def __init__(self, known: KnownHosts, accept_new: bool, hashed: bool = False) -> None:
        self._known = known
        self._accept_new = accept_new
        self._hashed = hashed

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if not self._accept_new:
            raise UnknownHostKey(hostname, key)
        self._known.record(hostname, key, self._hashed)


def apply(client: paramiko.SSHClient, known: KnownHosts, accept_new: bool,
          hashed: bool = False) -> None:
    """Put fleetclean's policy and the run's parsed known_hosts on one client; ``hashed``:
    a new key's host name is written hashed (``HashKnownHosts``)."""
    # One parsed HostKeys for every connection of the run: parsing known_hosts once per host
    # costs controller CPU, and paramiko offers no public setter for it.
    setattr(client, "_host_keys", known.keys)  # noqa: B010
    client.set_missing_host_key_policy(Policy(known, accept_new, hashed))


def apply_given(client: paramiko.SSHClient, known: KnownHosts, accept_new: bool) -> None:
    """The same policy on a client a caller made: the run's known_hosts become the keys it
    checks first, unless the caller loaded system keys into it already; keys the caller added
    itself stay."""
    own = vars(client).get("_system_host_keys")
    if own is None or not own.keys():
        setattr(client, "_system_host_keys", known.keys)  # noqa: B010
    client.set_missing_host_key_policy(Policy(known, accept_new))


class KnownHostsCache:
    """One ``KnownHosts`` per distinct list of files, for the whole run."""

    def __init__(self, extra: tuple[str, ...]) -> None:
        self._extra = extra
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], KnownHosts] = {}

    def get(self, own: str | None, wide: str | None = None) -> KnownHosts:
        """The files of ``UserKnownHostsFile`` (``own``; else ~/.ssh/known_hosts, as
        OpenSSH), then the run's extra files, over those of ``GlobalKnownHostsFile``
        (``wide``; else ssh's system-wide ones, ``system.known_hosts_files``), which are
        only read. An extra file adds to the user's, never replaces it: a key that changed
        there then read as a new host's, which --accept-new-host-keys accepted. A new key
        goes to ``own``'s first file, else to the first extra one (where the user asked for
        the fleet's keys), else to ~/.ssh/known_hosts."""
        # The system-wide files are read first so that where a user's file names the same
        # host and key type, the user's key is the one checked: a site file lags behind a
        # node reinstalled, and the user's own entry is the newer word.
        shared = [f for f in (wide.split() if wide else system.known_hosts_files())
                  if f.lower() != "none"]
        mine = [f for f in (own.split() if own else [DEFAULT_FILE]) if f.lower() != "none"]
        files = [*shared, *mine, *self._extra]
        write = mine[0] if own and mine else (self._extra[0] if self._extra else DEFAULT_FILE)
        key = (*files, "->", write)
        with self._lock:
            known = self._cache.get(key)
            if known is None:
                known = self._cache[key] = KnownHosts(tuple(files), write)
            return known
