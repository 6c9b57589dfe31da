"""fleetclean's host-key policy, applied to every connection and every hop.

OpenSSH's rules, not fabric's: fabric's ``Connection`` sets paramiko's ``AutoAddPolicy``,
which trusts any unknown key silently. Here an unknown key is refused with its fingerprint
unless the run accepts new keys (``--accept-new-host-keys`` or ``StrictHostKeyChecking
accept-new``), and a changed key is always refused (paramiko raises ``BadHostKeyException``
before any policy is asked).

Host certificates as ssh takes them (paramiko checks none, see ``upstream``): known_hosts'
``@cert-authority PATTERNS KEY`` lines name the CA keys trusted to sign the host keys of
the hosts the patterns match, and ``@revoked PATTERNS KEY`` lines keys never to take (a
host's key, or a CA's). A host that such a line names is judged here in full (``judge``),
whatever key it shows: a certificate only where a CA listed for that host signed it and it
is valid for the host now (``hostcerts.problem``); a plain key only where known_hosts lists
that very key for the host. Neither is ever taken as new, by ``--accept-new-host-keys`` or
``StrictHostKeyChecking accept-new``: where a CA vouches for a host, a key it did not
certify is no new host's key. The connection to such a host asks for certificates first
(``vouched``; ``upstream.transport``), as ssh does.

>>> key = paramiko.Ed25519Key(data=bytes.fromhex(
...     "0000000b7373682d656432353531390000002000000000000000000000000000000000"
...     "00000000000000000000000000000000"))
>>> fingerprint(key)
'SHA256:kmYcvdi2GkPeWxB6XLjrZB8JHsy2Hm8luHMFp9GMvqk'
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fleetclean.transport import hostcerts, system
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import (
    IndexedHostKeys,
    KeyTypes,
    ascii_lower,
    hashes_to,
    salted,
)

DEFAULT_FILE = "~/.ssh/known_hosts"
DEFAULT_FILES = [DEFAULT_FILE, "~/.ssh/known_hosts2"]  # ssh's UserKnownHostsFile default
CA_MARKER, REVOKED_MARKER = "@cert-authority", "@revoked"
MAX_SUBPATTERN = 1023  # a longer one matches nothing (OpenSSH's match_pattern_list)
_PORTED = re.compile(r"\[(.+)\]:([0-9]+)")


class UnknownHostKey(Exception):
    """A host offered a key that no known_hosts file lists, and the run accepts none."""

    def __init__(self, hostname: str, key: paramiko.PKey, read_only: bool = False) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key
        self.read_only = read_only  # UserKnownHostsFile none: no key can be recorded


class HostKeyRefused(Exception):
    """A host key that known_hosts' CA or revocation lines refuse; ``reason`` says why."""

    def __init__(self, hostname: str, key: paramiko.PKey, reason: str) -> None:
        super().__init__(f"{hostname}: {reason}")
        self.hostname = hostname
        self.key = key
        self.reason = reason


def host_key_name(address: str, port: int) -> str:
    """The name known_hosts is searched for, as ssh and paramiko write it.

    >>> host_key_name("10.0.0.7", 22), host_key_name("10.0.0.7", 2222)
    ('10.0.0.7', '[10.0.0.7]:2222')
    """
    return address if port == 22 else f"[{address}]:{port}"


_lower = ascii_lower


def _forms(hostname: str, aliased: bool = False) -> tuple[str, tuple[str, ...]]:
    """(the host name ssh connected to, lower case; the names its known_hosts lines are
    matched against): ``[addr]:port``, then ``addr`` alone, as ssh looks a host on another
    port up again without the port where it found nothing (``check_host_key``). A
    ``HostKeyAlias`` (``aliased``) is one name, as written, whatever brackets it has: ssh
    never looks an alias up without a port, and checks a certificate's principals against
    it whole.

    >>> _forms("[Node07]:2222"), _forms("[GPU]:2222", aliased=True)
    (('node07', ('[node07]:2222', 'node07')), ('[gpu]:2222', ('[gpu]:2222',)))
    """
    lowered = _lower(hostname)
    ported = None if aliased else _PORTED.fullmatch(lowered)
    if ported is None:
        return lowered, (lowered,)
    return ported.group(1), (lowered, ported.group(1))


def match_list(name: str, patterns: str) -> int:
    """OpenSSH's ``match_pattern_list`` of a lower-case name: 1 where a pattern of the
    comma list matches it and no ``!pattern`` does, -1 where a negated one does, else 0.

    >>> match_list("node07.lab", "*.lab,!node07.lab"), match_list("gpu1", "GPU?,x")
    (-1, 1)
    """
    found = 0
    for word in patterns.split(","):
        negated = word.startswith("!")
        sub = _lower(word[1:] if negated else word)
        if len(sub) >= MAX_SUBPATTERN:
            return 0
        if hostcerts.match_pattern(name, sub):
            if negated:
                return -1
            found = 1
    return found


def match_hosts(names: tuple[str, ...], field: str) -> bool:
    """Whether a known_hosts host field (patterns, or one hashed ``|1|salt|hash`` name)
    names any of ``names``, as ssh's ``match_maybe_hashed``."""
    if field.startswith("|"):
        pair = salted(field)  # a damaged hash names no host, as in ssh
        return pair is not None and any(hashes_to(*pair, name.encode()) for name in names)
    return any(match_list(name, field) == 1 for name in names)


@dataclass(frozen=True)
class Marked:
    """One ``@cert-authority`` or ``@revoked`` line: its host field, its key, where."""

    hosts: str
    key_type: str
    blob: bytes
    where: str  # file:line

    def names(self, names: tuple[str, ...]) -> bool:
        return match_hosts(names, self.hosts)


def _marked(text: str, where: str) -> tuple[str, Marked] | None:
    """(marker, line) of a known_hosts line with a marker; None where ssh would skip it."""
    fields = text.split()
    if len(fields) < 4 or fields[0] not in (CA_MARKER, REVOKED_MARKER):
        return None  # an unknown marker, two markers, a truncated line: ssh skips them
    marker, hosts, kind, text64 = fields[:4]
    try:
        blob = base64.b64decode(text64, validate=True)
    except (binascii.Error, ValueError):
        return None
    if marker == CA_MARKER:
        try:
            if hostcerts.plain_key(blob)[0] != kind:
                return None
        except hostcerts.CertError:
            return None  # a CA key that no certificate can name (ssh: an unreadable line)
    return marker, Marked(hosts, kind, blob, where)


def _revoked_blobs(line: Marked) -> tuple[bytes, ...] | None:
    """The key blobs a ``@revoked`` line revokes: its key, and where that key is a
    certificate, the key it certifies too (ssh compares public parts, whatever else the
    certificate holds); None for a certificate whose key cannot be read: the hosts the
    line names are refused (what it revokes cannot be told)."""
    if not line.key_type.endswith(hostcerts.CERT_SUFFIX):
        return (line.blob,)
    certified = hostcerts.certified_key(line.blob)
    return None if certified is None else (line.blob, certified)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:…`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts:
    """known_hosts files shared by all connections of one run; thread-safe for accept-new.
    ``write``: the file a newly accepted key goes to (default: the first of ``files``)."""

    def __init__(self, files: tuple[str, ...], write: str | None = None,
                 read_only: bool = False, revoked: str | None = None) -> None:
        self._files = files
        self._write = write
        self.read_only = read_only  # no file to record a new key in (UserKnownHostsFile none)
        self._lock = threading.Lock()
        self._keys = IndexedHostKeys()  # paramiko's scans every entry per lookup
        self._cas: list[Marked] = []
        self._revoked: list[Marked] = []
        self._krl = ""  # RevokedHostKeys as a KRL: asked of ssh-keygen -Q, key by key
        self._unreadable = ""  # a RevokedHostKeys file that cannot be read: why
        for f in files:
            self._load(Path(f).expanduser())
        if revoked and revoked.lower() != "none":
            self._load_revoked(Path(revoked).expanduser())
        self._store = _Store(self)

    def _load_revoked(self, path: Path) -> None:
        """ssh_config's ``RevokedHostKeys``: a file of public keys, one a line, each
        revoked for every host, or a KRL (ssh-keygen -k). As ssh, a file that cannot be
        read refuses every host: what it revokes cannot be told."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            self._unreadable = f"RevokedHostKeys {path} cannot be read ({exc.strerror})"
            return
        if data.startswith(b"SSHKRL\n\0"):
            self._krl = str(path)
            return
        for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            fields = line.split()
            if len(fields) < 2 or fields[0].startswith("#"):
                continue
            try:
                blob = base64.b64decode(fields[1], validate=True)
            except (binascii.Error, ValueError):
                continue
            self._revoked.append(Marked("*", fields[0], blob, f"{path}:{number}"))

    def _krl_refuses(self, key: paramiko.PKey) -> str:
        """Why the RevokedHostKeys KRL refuses ``key`` ("" where it does not): ssh-keygen
        -Q reads it (a KRL is OpenSSH's own binary format); an answer it cannot give
        refuses, as ssh refuses what it cannot check."""
        line = f"{key.get_name()} {key.get_base64()}\n"
        with tempfile.NamedTemporaryFile("w", suffix=".pub") as fh:
            fh.write(line)
            fh.flush()
            try:
                done = subprocess.run(["ssh-keygen", "-Q", "-f", self._krl, fh.name],
                                      capture_output=True, text=True, timeout=30,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"the RevokedHostKeys KRL {self._krl} cannot be checked ({exc})"
        if done.returncode == 0:
            return ""
        if "REVOKED" in done.stdout:
            return (f"host key {key.get_name()} {fingerprint(key)} is revoked by "
                    f"RevokedHostKeys {self._krl}")
        return (f"the RevokedHostKeys KRL {self._krl} cannot be checked (ssh-keygen -Q: "
                f"{' '.join((done.stderr or done.stdout).split())[:200]})")

    def _load(self, path: Path) -> None:
        # Line by line: paramiko's own loader gives up on the whole file at the first line
        # it cannot read (@cert-authority and @revoked markers, which it does not support
        # and which are kept here, or a damaged entry), and one such line must not cost
        # every other host its key.
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            if text.startswith("@"):
                found = _marked(text, f"{path}:{number}")
                if found is not None:
                    (self._cas if found[0] == CA_MARKER else self._revoked).append(found[1])
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
        """The plain keys, by host name."""
        return self._keys

    @property
    def store(self) -> _Store:
        """What a paramiko client is given as its host keys (see ``_Store``)."""
        return self._store

    def marked(self, hostname: str, aliased: bool = False) -> bool:
        """Whether an ``@cert-authority`` or ``@revoked`` line names ``hostname`` (as
        paramiko names a host: ``addr`` or ``[addr]:port``; ``aliased``: a
        ``HostKeyAlias``, one name as written)."""
        if self._krl or self._unreadable:
            return True  # RevokedHostKeys: every key goes to judge
        if not self._cas and not self._revoked:
            return False
        forms = _forms(hostname, aliased)[1]
        return any(line.names(forms) for line in (*self._cas, *self._revoked))

    def vouched(self, hostname: str, aliased: bool = False) -> bool:
        """Whether an ``@cert-authority`` line names ``hostname`` (``aliased``: as in
        ``marked``): its connection asks for a certificate first, and takes no key as
        new."""
        if not self._cas:
            return False
        forms = _forms(hostname, aliased)[1]
        return any(line.names(forms) for line in self._cas)

    def judge(self, hostname: str, key: paramiko.PKey, now: float | None = None,
              aliased: bool = False) -> bool:
        """OpenSSH's ``check_host_key`` for the key a host showed: True where known_hosts
        vouches for it (a valid certificate of a CA listed for the host, or that very key
        listed for it), False where it knows no key for the host (new: the caller decides);
        raises ``HostKeyRefused`` (revoked, a certificate that fails, a plain key where only
        a CA vouches) or ``paramiko.BadHostKeyException`` (another key listed).
        ``aliased``: ``hostname`` is a ``HostKeyAlias``, the one name every line is matched
        against and a certificate's principals are checked against."""
        name, forms = _forms(hostname, aliased)
        plain = key.asbytes()
        shown = getattr(key, "public_blob", None)
        cert = None
        if shown is not None and shown.key_type.endswith(hostcerts.CERT_SUFFIX):
            try:
                cert = hostcerts.parse(shown.key_blob)
            except hostcerts.CertError as exc:
                raise HostKeyRefused(hostname, key, "host certificate refused: it cannot be "
                                     f"read ({exc})") from None
            if cert.key_blob != plain:  # paramiko's key is the one the host signed with
                raise HostKeyRefused(hostname, key, "host certificate refused: it holds "
                                     "another key than the one the host signed with")
        revoked = self._revocation(forms, key, cert)
        if revoked:
            raise HostKeyRefused(hostname, key, revoked)
        cas = [line for line in self._cas if line.names(forms)]
        # ssh takes the host where any line, of any file, lists the key it shows
        # (hostfile.c keeps looking for HOST_OK): a stale site entry beside the user's
        # newer one included.
        if cert is not None:
            why = self._cert_problem(cert, cas, name, hostname, now)
            if why is None:
                return True
            # As ssh: a certificate that fails is judged again as the plain key it
            # certifies, which only a line for that very key vouches for; never as new.
            if self._keys.listed(hostname, key):
                return True
            raise HostKeyRefused(hostname, key, f"host certificate refused: {why}")
        if self._keys.listed(hostname, key):
            return True
        listed = self._keys.every(hostname)  # not that key: another one, or a new host
        if listed:
            expected = listed.get(key.get_name()) or next(iter(listed.values()))
            raise paramiko.BadHostKeyException(hostname, key, expected[-1])
        if cas:
            raise HostKeyRefused(hostname, key, (
                f"plain host key {key.get_name()} {fingerprint(key)} refused: no "
                f"certificate, where known_hosts vouches for this host only through a CA "
                f"({cas[0].where}), and a key no CA certified is never taken as new. Give "
                "its sshd a HostCertificate, or list this key in known_hosts"))
        return False

    def _revocation(self, forms: tuple[str, ...], key: paramiko.PKey,
                    cert: hostcerts.Cert | None) -> str:
        """Why a revocation refuses ``key`` (and ``cert``, the certificate it came in) for
        a host of these names: RevokedHostKeys, an ``@revoked`` line; "" where none does."""
        if self._unreadable:
            return f"{self._unreadable}: refused, as by ssh"
        why = self._krl_refuses(key) if self._krl else ""
        plain = key.asbytes()
        for line in self._revoked:
            if why or not line.names(forms):
                continue
            revoked = _revoked_blobs(line)
            if revoked is None:
                why = (f"an @revoked line names this host ({line.where}) whose certificate's "
                       "key cannot be read: refused, since what it revokes cannot be told")
            elif plain in revoked:
                why = f"host key {key.get_name()} {fingerprint(key)} is @revoked ({line.where})"
            elif cert is not None and cert.ca_blob in revoked:
                why = (f"host certificate refused: its CA {cert.ca_type} "
                       f"{hostcerts.fingerprint(cert.ca_blob)} is @revoked ({line.where})")
        return why

    @staticmethod
    def _cert_problem(cert: hostcerts.Cert, cas: list[Marked], name: str, hostname: str,
                      now: float | None) -> str | None:
        signers = [line for line in cas if line.blob == cert.ca_blob]
        if not signers:
            ca = f"{cert.ca_type} {hostcerts.fingerprint(cert.ca_blob)}"
            listed = (f"the @cert-authority lines for it ({cas[0].where}) name other CAs"
                      if cas else "no @cert-authority line names it")
            return f"it is signed by a CA not trusted for {hostname} ({ca}; {listed})"
        return hostcerts.problem(cert, name, time.time() if now is None else now)

    def record(self, hostname: str, key: paramiko.PKey, hashed: bool = False) -> None:
        """Append a newly accepted key to the first file, like OpenSSH's accept-new;
        ``hashed`` (``HashKnownHosts yes``, Debian's and Ubuntu's system-wide default): the
        name written as ssh writes it then, hashed, so that the file does not list the hosts
        this user reaches."""
        hostname = _lower(hostname)  # as ssh writes it (hostfile.c format_host_entry)
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
    """Refuse unknown keys, or record them when the run accepts new ones; ``alias``: the
    name known_hosts knows the host by (``HostKeyAlias``), whatever paramiko calls it."""

    def __init__(self, known: KnownHosts, accept_new: bool, hashed: bool = False,
                 alias: str | None = None) -> None:
        self._known = known
        self._accept_new = accept_new
        self._hashed = hashed
        self._alias = alias

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        # paramiko asks here where its lookup found no key: every key of a host that a CA
        # or revocation line names (``_Store``), and a new host's.
        hostname = self._alias or hostname
        if self._known.judge(hostname, key, aliased=self._alias is not None):
            return
        if not self._accept_new or self._known.read_only:
            raise UnknownHostKey(hostname, key, read_only=self._known.read_only)
        self._known.record(hostname, key, self._hashed)


class _Store:
    """What paramiko's ``SSHClient`` asks of its host keys (``get``): the run's plain keys,
    except for a host that an ``@cert-authority`` or ``@revoked`` line names, or that has
    two keys of one type listed, and wherever a name is hashed: there it has none, so that
    paramiko gives every key that host shows to ``Policy`` (paramiko's own check compares
    one plain key a type, and would take a revoked one, refuse a valid certificate beside
    an old key, or refuse the user's key where the site's file lists a stale one; and to
    find a host's hashed keys is to hash its name with every hashed entry's salt, where
    ``Policy`` hashes it only for the entries of the key the host shows)."""

    def __init__(self, known: KnownHosts) -> None:
        self._known = known

    def get(self, hostname: str, default: object = None, aliased: bool = False) -> object:
        keys = self._known.keys
        plain = keys.plain(hostname)
        if (self._known.marked(hostname, aliased) or keys.hashed
                or any(len(listed) > 1 for listed in plain.values())):
            return default  # Policy judges: paramiko compares one key a type
        return KeyTypes({kind: listed[-1] for kind, listed in plain.items()}) or default


class _Aliased:
    """``_Store`` for a client whose host known_hosts knows by another name
    (``HostKeyAlias``)."""

    def __init__(self, store: _Store, alias: str) -> None:
        self._store = store
        self._alias = alias

    def get(self, hostname: str, default: object = None) -> object:
        return self._store.get(self._alias, default, aliased=True)


def key_name(address: str, port: int, alias: str | None = None) -> str:
    """The name ssh looks a host's key up by, and records it under: ssh_config's
    ``HostKeyAlias`` as it is written (lower case, never with a port, as in ssh's
    ``get_hostfile_hostname_ipaddr``), else ``host_key_name``.

    >>> key_name("10.0.0.7", 2222, "Node07-Via-Tunnel"), key_name("10.0.0.7", 2222)
    ('node07-via-tunnel', '[10.0.0.7]:2222')
    """
    return _lower(alias) if alias else host_key_name(address, port)


def apply(client: paramiko.SSHClient, known: KnownHosts, accept_new: bool,
          hashed: bool = False, alias: str | None = None) -> None:
    """Put fleetclean's policy and the run's parsed known_hosts on one client; ``hashed``:
    a new key's host name is written hashed (``HashKnownHosts``); ``alias``: the host's
    ``HostKeyAlias``, the one name its key is looked up, judged (a certificate's
    principals too) and recorded by."""
    # One parsed HostKeys for every connection of the run: parsing known_hosts once per host
    # costs controller CPU, and paramiko offers no public setter for it.
    store: _Store | _Aliased = known.store
    if alias:
        # paramiko names the host key by the host and port it was given, with no other
        # name to ask for (https://github.com/paramiko/paramiko/pull/2217, open): here its
        # lookup and its policy are handed the alias instead.
        alias = key_name("", 0, alias)
        store = _Aliased(known.store, alias)
    setattr(client, "_host_keys", store)  # noqa: B010
    client.set_missing_host_key_policy(Policy(known, accept_new, hashed, alias))


def apply_given(client: paramiko.SSHClient, known: KnownHosts, accept_new: bool) -> None:
    """The same policy on a client a caller made: the run's known_hosts become the keys it
    checks first, unless the caller loaded system keys into it already; keys the caller added
    itself stay."""
    own = vars(client).get("_system_host_keys")
    if own is None or not own.keys():
        setattr(client, "_system_host_keys", known.store)  # noqa: B010
    client.set_missing_host_key_policy(Policy(known, accept_new))


class KnownHostsCache:
    """One ``KnownHosts`` per distinct list of files, for the whole run."""

    def __init__(self, extra: tuple[str, ...]) -> None:
        self._extra = extra
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], KnownHosts] = {}

    def get(self, own: str | None, wide: str | None = None,
            revoked: str | None = None) -> KnownHosts:
        """The files of ``UserKnownHostsFile`` (``own``; else ~/.ssh/known_hosts, as
        OpenSSH), then the run's extra files, over those of ``GlobalKnownHostsFile``
        (``wide``; else ssh's system-wide ones, ``system.known_hosts_files``), which are
        only read. An extra file adds to the user's, never replaces it: a key that changed
        there then read as a new host's, which --accept-new-host-keys accepted. A new key
        goes to ``own``'s first file, else to the first extra one (where the user asked for
        the fleet's keys), else to ~/.ssh/known_hosts."""
        # A key any of them lists for the host is taken (IndexedHostKeys keeps them all):
        # a site file that lags behind a node reinstalled does not refuse the user's newer
        # entry. UserKnownHostsFile none: no user file, and (as ssh) nothing is recorded:
        # a new host is refused, accept-new or not, unless the run named a file of its own.
        shared = [f for f in (wide.split() if wide else system.known_hosts_files())
                  if f.lower() != "none"]
        mine = [f for f in (own.split() if own else DEFAULT_FILES) if f.lower() != "none"]
        files = [*shared, *mine, *self._extra]
        extra = self._extra[0] if self._extra else None
        write = (mine[0] if mine else extra) if own else (extra or DEFAULT_FILE)
        key = (*files, "->", str(write), "revoked", str(revoked))
        with self._lock:
            known = self._cache.get(key)
            if known is None:
                known = self._cache[key] = KnownHosts(tuple(files), write,
                                                      read_only=write is None,
                                                      revoked=revoked)
            return known
