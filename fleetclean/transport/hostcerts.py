"""OpenSSH host certificates, read and judged as ssh judges them.

paramiko negotiates ``*-cert-v01@openssh.com`` host keys and takes the key out of the
certificate, but checks nothing else of it (https://github.com/paramiko/paramiko/issues/771):
not who signed it, not for which host, not when. Here a certificate (PROTOCOL.certkeys) is
read as OpenSSH's ``cert_parse`` reads it, and judged as ``sshkey_cert_check_host`` judges
it for the host ssh connected to (``hostkeys`` decides which CA keys may have signed it):

- ``parse``: strictly; every length checked, nothing left after the signature, a CA key
  that is no certificate itself, an RSA key of at least 1024 bits. Anything else raises
  ``CertError``;
- ``problem``: why ssh would refuse it for a host name, or None: not a host certificate,
  not yet valid or expired, no principals at all or none that is the name (compared
  exactly, as OpenSSH before 10.3 compares them: 10.3 also takes ``*`` and ``?`` patterns
  there, which fleetclean refuses, and OpenSSH before 10.3 takes a certificate with no
  principals for any host, which fleetclean refuses too), a critical option (no host
  certificate may have one), a signature algorithm OpenSSH no longer takes from a CA
  (``ssh-rsa``, SHA-1), a signature that does not verify over the certificate's body;
- ``certified_key``: the key a certificate certifies, read as little as that takes (an
  ``@revoked`` certificate revokes its key, whatever else it holds).

What a certificate says is shown (``shown``) with its control characters escaped: a server
chooses it, and it must not write to the terminal.

>>> match_pattern("node07.cluster.example", "*.cluster.example")
True
>>> match_pattern("node7", "node??")
False
>>> match_pattern("nodé", "nod?")  # bytes, as ssh: é is two of them
False
>>> print(shown("id" + chr(27) + "[2J" + chr(7)))
'id\\x1b[2J\\x07'
"""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import re
import struct
from dataclasses import dataclass

from fleetclean.transport.sshlib import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
USER_CERT, HOST_CERT = 1, 2
FOREVER = 2**64 - 1
MAX_PRINCIPALS = 256  # OpenSSH's SSHKEY_CERT_MAX_PRINCIPALS
MIN_RSA_BITS = 1024  # OpenSSH's SSH_RSA_MINIMUM_MODULUS_SIZE
# OpenSSH's CASignatureAlgorithms default for each CA key type (the sk-* ones paramiko
# cannot verify: such a CA is refused). ssh-rsa, SHA-1, is no longer among them (8.2).
CA_SIGNATURES = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
}
ECDSA_CURVES = {"ecdsa-sha2-nistp256": "nistp256", "ecdsa-sha2-nistp384": "nistp384",
                "ecdsa-sha2-nistp521": "nistp521"}
PLAIN_TYPES = tuple(CA_SIGNATURES)


class CertError(ValueError):
    """A certificate (or a CA key) that cannot be read; its text says why."""


class _Wire:
    """SSH wire encoding (RFC 4251), read strictly."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise CertError("truncated")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def u32(self) -> int:
        value: int = struct.unpack(">I", self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack(">Q", self.take(8))[0]
        return value

    def string(self) -> bytes:
        return self.take(self.u32())

    def text(self) -> str:
        raw = self.string()
        if b"\0" in raw:
            raise CertError("a text field holds a NUL byte")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CertError("a text field is not UTF-8") from None

    def end(self) -> None:
        if self.at != len(self.data):
            raise CertError(f"{len(self.data) - self.at} bytes after the end")

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def _string(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _key_fields(wire: _Wire, plain: str) -> bytes:
    """The public fields of a ``plain`` key, read from ``wire``, as they were encoded."""
    start = wire.at
    if plain == "ssh-ed25519":
        if len(wire.string()) != 32:
            raise CertError("an Ed25519 key is not 32 bytes")
    elif plain in ECDSA_CURVES:
        if wire.string() != ECDSA_CURVES[plain].encode():
            raise CertError(f"{plain} names another curve")
        wire.string()  # the point: checked on the curve by cryptography, when loaded
    elif plain == "ssh-rsa":
        exponent, modulus = wire.string(), wire.string()
        if not exponent or not modulus or modulus[0] & 0x80 or exponent[0] & 0x80:
            raise CertError("an RSA key with a negative or empty number")
        if int.from_bytes(modulus, "big").bit_length() < MIN_RSA_BITS:
            raise CertError(f"an RSA key of fewer than {MIN_RSA_BITS} bits")
    else:
        raise CertError(f"key type {plain!r} is not supported")
    return wire.data[start:wire.at]


def plain_key(blob: bytes) -> tuple[str, bytes]:
    """(type, blob) of a plain public key blob, checked as ``parse`` checks a CA key."""
    wire = _Wire(blob)
    kind = wire.text()
    _key_fields(wire, kind)
    wire.end()
    return kind, blob


def _pairs(raw: bytes) -> tuple[tuple[str, bytes], ...]:
    """Critical options or extensions: (name, data) pairs."""
    wire, found = _Wire(raw), []
    while wire.left:
        found.append((wire.text(), wire.string()))
    return tuple(found)


@dataclass(frozen=True)
class Cert:
    """An OpenSSH certificate, as read by ``parse``."""

    cert_type: str  # "ssh-ed25519-cert-v01@openssh.com"
    key_type: str  # "ssh-ed25519": the certified key's own
    key_blob: bytes  # the certified key, as a plain public key blob
    serial: int
    kind: int  # USER_CERT or HOST_CERT
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical: tuple[tuple[str, bytes], ...]
    extensions: tuple[tuple[str, bytes], ...]
    ca_type: str
    ca_blob: bytes  # the signing CA's public key blob
    signature: bytes  # the signature blob: algorithm, then the signature
    signed: bytes  # what the signature covers: every byte before it

    @property
    def signature_type(self) -> str:
        return _Wire(self.signature).text()

    def validity(self) -> str:
        """As ``ssh-keygen -L`` says it: "forever", "from A to B", "after A", "before B"."""
        if self.valid_after == 0 and self.valid_before == FOREVER:
            return "forever"
        if self.valid_before == FOREVER:
            return f"after {when(self.valid_after)}"
        if self.valid_after == 0:
            return f"before {when(self.valid_before)}"
        return f"from {when(self.valid_after)} to {when(self.valid_before)}"


def when(seconds: int) -> str:
    """A certificate's time, UTC.

    >>> when(0), when(FOREVER)
    ('1970-01-01 00:00:00 UTC', 'forever')
    """
    if seconds == FOREVER:
        return "forever"
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{seconds} s after 1970"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def parse(blob: bytes) -> Cert:
    """A certificate blob (what a server sends as its host key) read as OpenSSH reads it;
    the signature is read, not yet verified (``problem`` does). Raises ``CertError``."""
    wire = _Wire(blob)
    cert_type = wire.text()
    if not cert_type.endswith(CERT_SUFFIX):
        raise CertError(f"{cert_type!r} is not a certificate type")
    plain = cert_type[: -len(CERT_SUFFIX)]
    if plain not in PLAIN_TYPES:
        raise CertError(f"certificate type {cert_type!r} is not supported")
    wire.string()  # nonce
    fields = _key_fields(wire, plain)
    serial, kind, key_id = wire.u64(), wire.u32(), wire.text()
    packed = _Wire(wire.string())
    principals: list[str] = []
    while packed.left:
        if len(principals) >= MAX_PRINCIPALS:
            raise CertError(f"more than {MAX_PRINCIPALS} principals")
        principals.append(packed.text())
    valid_after, valid_before = wire.u64(), wire.u64()
    critical, extensions = _pairs(wire.string()), _pairs(wire.string())
    wire.string()  # reserved
    ca_blob = wire.string()
    signed = blob[:wire.at]
    signature = wire.string()
    wire.end()
    if kind not in (USER_CERT, HOST_CERT):
        raise CertError(f"unknown certificate type {kind}")
    try:
        ca_type, _ = plain_key(ca_blob)
    except CertError as exc:
        raise CertError(f"its CA key cannot be used: {exc}") from None
    sig = _Wire(signature)
    sig.text()
    sig.string()
    sig.end()
    return Cert(cert_type, plain, _string(plain.encode()) + fields, serial, kind, key_id,
                tuple(principals), valid_after, valid_before, critical, extensions, ca_type,
                ca_blob, signature, signed)


def certified_key(blob: bytes) -> bytes | None:
    """The plain key blob a certificate certifies, read as little as that takes (its
    type, nonce and key fields; nothing after them is checked); None where even that
    cannot be read."""
    wire = _Wire(blob)
    try:
        cert_type = wire.string().decode("ascii")
        plain = cert_type[: -len(CERT_SUFFIX)] if cert_type.endswith(CERT_SUFFIX) else ""
        if plain not in PLAIN_TYPES:
            return None
        wire.string()  # nonce
        return _string(plain.encode()) + _key_fields(wire, plain)
    except (CertError, UnicodeDecodeError):
        return None


def signature_verifies(cert: Cert) -> bool:
    """The CA's signature over the certificate's body, by an algorithm OpenSSH accepts
    from a CA for that CA key (``CA_SIGNATURES``)."""
    if cert.signature_type not in CA_SIGNATURES.get(cert.ca_type, ()):
        return False
    try:
        ca = paramiko.PKey.from_type_string(cert.ca_type, cert.ca_blob)
        return bool(ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)))
    except Exception:  # a CA key or signature its parser refuses: not verified
        return False


def problem(cert: Cert, name: str, now: float) -> str | None:
    """Why ssh refuses ``cert`` as the host key of ``name`` (the host name it connected
    to, lower case) at ``now``; None where it accepts it. The CA is the caller's to check.
    """
    # The signature first: what an unverified certificate says is no fact to report.
    if cert.signature_type not in CA_SIGNATURES[cert.ca_type]:
        return (f"its CA signed it with {shown(cert.signature_type)}, which ssh does not take "
                "from a CA")
    if not signature_verifies(cert):
        return "its signature does not verify (a forged or damaged certificate)"
    return _claims_problem(cert, name, now)


def _claims_problem(cert: Cert, name: str, now: float) -> str | None:
    """What a verified certificate says, judged for ``name`` at ``now``."""
    if cert.kind != HOST_CERT:
        return "it is a user certificate, not a host certificate"
    if now < cert.valid_after:
        return f"it is not yet valid (valid {cert.validity()})"
    if now >= cert.valid_before:
        return f"it expired (valid {cert.validity()})"
    if not cert.principals:
        return "it lists no principals (ssh takes no such host certificate)"
    if name not in cert.principals:
        listed = ", ".join(shown(p) for p in cert.principals[:6])
        more = ", ..." if len(cert.principals) > 6 else ""
        return f"{name} is not among its principals ({listed}{more}; compared exactly)"
    if cert.critical:
        names = ", ".join(shown(n) for n, _ in cert.critical)
        return f"it has critical options ({names}), which no host certificate may have"
    return None


def shown(text: str) -> str:
    """``text`` from a certificate, fit to print: quoted, its control characters escaped."""
    return repr(text) if any(c < " " or "\x7f" <= c < "\xa0" for c in text) else text


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[bytes]:
    parts = (b".*" if c == 42 else b"." if c == 63 else re.escape(bytes([c]))
             for c in pattern.encode())
    return re.compile(b"".join(parts), re.DOTALL)


def match_pattern(text: str, pattern: str) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` any run of bytes, ``?`` one, the rest itself
    (case as given), on the UTF-8 bytes as ssh compares them."""
    return _compiled(pattern).fullmatch(text.encode()) is not None


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
