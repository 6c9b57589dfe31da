"""OpenSSH host certificates (``transport/hostcerts.py``) and known_hosts' ``@cert-authority``
and ``@revoked`` lines (``transport/hostkeys.py``), on certificates the real ``ssh-keygen -s``
made: judged as ssh judges them, where paramiko checks none (paramiko#771)."""

from __future__ import annotations

import base64
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from fleetclean.transport import hostcerts
from fleetclean.transport.classify import Phase, Where, classify
from fleetclean.transport.hostkeys import HostKeyRefused, KnownHosts, Policy, match_list
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import transport

HOST = "node07.cluster.example"


def keygen(path: Path, kind: str = "ed25519", *extra: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path), *extra],
                   check=True)
    return path


def pub(path: Path) -> tuple[str, bytes]:
    kind, text = path.with_name(path.name + ".pub").read_text().split()[:2]
    return kind, base64.b64decode(text)


def sign(ca: Path, key: Path, *opts: str) -> bytes:
    """``ssh-keygen -s CA -I test OPTS KEY.pub``: the certificate's blob."""
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "test", *opts,
                    str(key) + ".pub"], check=True)
    kind, text = Path(str(key) + "-cert.pub").read_text().split()[:2]
    assert kind.endswith(hostcerts.CERT_SUFFIX)
    return base64.b64decode(text)


def shown(blob: bytes) -> paramiko.PKey:
    """The key paramiko makes of a host key blob a server sent (``Transport._verify_key``)."""
    kind = paramiko.Message(blob).get_text()
    algorithm = "rsa-sha2-512" + hostcerts.CERT_SUFFIX if kind.startswith("ssh-rsa") else kind
    key: paramiko.PKey = paramiko.Transport._key_info[algorithm](paramiko.Message(blob))
    return key


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    return keygen(tmp_path / "ca")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return keygen(tmp_path / "host")


def problem(blob: bytes, name: str = HOST) -> str | None:
    return hostcerts.problem(hostcerts.parse(blob), name, time.time())


# -- the certificate itself ------------------------------------------------------------


def test_parse_reads_what_ssh_keygen_wrote(ca: Path, host: Path) -> None:
    blob = sign(ca, host, "-h", "-n", f"{HOST},10.1.0.7", "-z", "42",
                "-V", "20300101000000Z:20300102000000Z")
    cert = hostcerts.parse(blob)
    assert cert.cert_type == "ssh-ed25519-cert-v01@openssh.com"
    assert (cert.kind, cert.key_id, cert.serial) == (hostcerts.HOST_CERT, "test", 42)
    assert cert.principals == (HOST, "10.1.0.7")
    assert (cert.valid_after, cert.valid_before) == (1893456000, 1893542400)
    assert cert.validity() == "from 2030-01-01 00:00:00 UTC to 2030-01-02 00:00:00 UTC"
    assert cert.key_blob == pub(host)[1] and cert.ca_blob == pub(ca)[1]
    assert cert.signature_type == "ssh-ed25519" and cert.critical == ()
    assert shown(blob).asbytes() == cert.key_blob  # the key paramiko verifies the kex with


@pytest.mark.parametrize(("key_kind", "ca_kind"), [
    ("ecdsa", "ed25519"), ("rsa", "ecdsa"), ("ed25519", "rsa"),
])
def test_every_key_type_and_ca_type_verifies(tmp_path: Path, key_kind: str,
                                             ca_kind: str) -> None:
    ca = keygen(tmp_path / "ca", ca_kind)
    key = keygen(tmp_path / "key", key_kind)
    blob = sign(ca, key, "-h", "-n", HOST)
    assert problem(blob) is None
    assert hostcerts.parse(blob).key_blob == pub(key)[1] == shown(blob).asbytes()


def test_a_valid_host_certificate_passes(ca: Path, host: Path) -> None:
    assert problem(sign(ca, host, "-h", "-n", f"other,{HOST}", "-V", "-1h:+1h")) is None


def test_expired_and_not_yet_valid(ca: Path, host: Path) -> None:
    old = problem(sign(ca, host, "-h", "-n", HOST, "-V", "20200101000000Z:20200102000000Z"))
    assert old == ("it expired (valid from 2020-01-01 00:00:00 UTC to "
                   "2020-01-02 00:00:00 UTC)")
    assert "not yet valid" in (problem(sign(ca, host, "-h", "-n", HOST, "-V", "+1d:+2d"))
                               or "")


def test_the_host_name_must_be_a_principal(ca: Path, host: Path) -> None:
    blob = sign(ca, host, "-h", "-n", "node08.cluster.example,10.1.0.8")
    assert problem(blob) == (f"{HOST} is not among its principals "
                             "(node08.cluster.example, 10.1.0.8; compared exactly)")
    # Compared exactly, as OpenSSH before 10.3 compares host principals (this machine's
    # 9.2 refuses a "*" principal): a CA that signed one by mistake does not vouch for
    # every host of the fleet.
    for pattern in ("*.cluster.example", "node0?.cluster.example", "*"):
        assert problem(sign(ca, host, "-h", "-n", pattern)) is not None
    assert problem(sign(ca, host, "-h", "-n", f"x,{HOST}")) is None


def test_no_principals_user_certificates_critical_options_sha1_refused(
    ca: Path, host: Path, tmp_path: Path
) -> None:
    assert problem(sign(ca, host, "-h")) == (
        "it lists no principals (ssh takes no such host certificate)")
    assert problem(sign(ca, host, "-n", HOST)) == (
        "it is a user certificate, not a host certificate")
    assert problem(sign(ca, host, "-h", "-n", HOST, "-O", "force-command=true")) == (
        "it has critical options (force-command), which no host certificate may have")
    rsa_ca = keygen(tmp_path / "rsa_ca", "rsa", "-b", "2048")
    assert problem(sign(rsa_ca, host, "-h", "-n", HOST, "-t", "ssh-rsa")) == (
        "its CA signed it with ssh-rsa, which ssh does not take from a CA")
    assert problem(sign(rsa_ca, host, "-h", "-n", HOST, "-t", "rsa-sha2-256")) is None


def test_a_changed_byte_breaks_the_signature(ca: Path, host: Path) -> None:
    blob = sign(ca, host, "-h", "-n", "node07.cluster.examplf")
    forged = blob.replace(b"examplf", b"example")  # the principal, changed after signing
    assert problem(forged) == "its signature does not verify (a forged or damaged certificate)"


@pytest.mark.parametrize("cut", [
    lambda b: b[:-1],  # the signature cut short
    lambda b: b + b"\0",  # a byte after it
    lambda b: b[:4] + b"ssh-ed25519-cert-v02@openssh.com" + b[36:],  # unknown type
])
def test_malformed_certificates_are_refused(ca: Path, host: Path, cut) -> None:
    blob = sign(ca, host, "-h", "-n", HOST)
    with pytest.raises(hostcerts.CertError):
        hostcerts.parse(cut(blob))


def test_host_patterns_as_ssh_matches_them() -> None:
    assert match_list("node07.cluster.example", "*.cluster.example,10.1.*") == 1
    assert match_list("10.1.0.7", "*.cluster.example,10.1.*") == 1
    assert match_list("10.2.0.7", "*.cluster.example,10.1.*") == 0
    assert match_list("login.cluster.example", "*.cluster.example,!login.*") == -1
    assert match_list("[node07.lab]:2222", "[*.lab]:2222") == 1
    assert match_list("node07.lab", "NODE0?.LAB") == 1  # patterns are lowered too
    assert match_list("node7.lab", "node0?.lab") == 0


# -- known_hosts and the policy paramiko asks --------------------------------------------


def known_hosts(tmp_path: Path, *lines: str) -> tuple[KnownHosts, Path]:
    path = tmp_path / "known_hosts"
    path.write_text("".join(line + "\n" for line in lines))
    return KnownHosts((str(path),)), path


def ca_line(ca: Path, patterns: str = "*.cluster.example,10.1.*",
            marker: str = "@cert-authority") -> str:
    kind, blob = pub(ca)
    return f"{marker} {patterns} {kind} {base64.b64encode(blob).decode()}"


def accept(known: KnownHosts, name: str, key: paramiko.PKey, accept_new: bool = False) -> None:
    """What paramiko's SSHClient does with the key a host showed: its lookup, then the
    policy where the lookup found nothing."""
    found = known.store.get(name)
    if found is None:
        Policy(known, accept_new).missing_host_key(None, name, key)  # type: ignore[arg-type]
    elif found.get(key.get_name()) != key:  # type: ignore[attr-defined]
        raise paramiko.BadHostKeyException(name, key, key)


def test_a_certificate_of_a_listed_ca_is_accepted_and_nothing_recorded(
    ca: Path, host: Path, tmp_path: Path
) -> None:
    known, path = known_hosts(tmp_path, ca_line(ca))
    before = path.read_text()
    key = shown(sign(ca, host, "-h", "-n", f"{HOST},10.1.0.7"))
    assert known.vouched(HOST) and known.vouched("10.1.0.7") and not known.vouched("10.2.0.7")
    assert known.store.get(HOST) is None  # paramiko's own check is bypassed: Policy judges
    accept(known, HOST, key, accept_new=True)
    accept(known, "10.1.0.7", key)
    accept(known, "NODE07.Cluster.Example", key)  # ssh lowers the name
    assert path.read_text() == before


def test_other_ports_match_with_and_without_the_port(ca: Path, host: Path,
                                                     tmp_path: Path) -> None:
    key = shown(sign(ca, host, "-h", "-n", HOST))
    known, _ = known_hosts(tmp_path, ca_line(ca, "*.cluster.example"))
    accept(known, f"[{HOST}]:2222", key)  # principal: the name, without the port
    known, _ = known_hosts(tmp_path, ca_line(ca, "[*.cluster.example]:2222"))
    accept(known, f"[{HOST}]:2222", key)
    assert not known.vouched(HOST) and not known.vouched(f"[{HOST}]:2200")


def test_hashed_and_negated_patterns(ca: Path, host: Path, tmp_path: Path) -> None:
    key = shown(sign(ca, host, "-h", "-n", HOST))
    known, _ = known_hosts(tmp_path, ca_line(ca, paramiko.HostKeys.hash_host(HOST)))
    accept(known, HOST, key)
    known, _ = known_hosts(tmp_path, ca_line(ca, "*.cluster.example,!node07.*"))
    with pytest.raises(HostKeyRefused, match="no @cert-authority line names it"):
        accept(known, HOST, key, accept_new=True)


@pytest.mark.parametrize(("opts", "why"), [
    (("-h", "-n", "node08.cluster.example"), "is not among its principals"),
    (("-h", "-n", HOST, "-V", "20200101:20200102"), "it expired"),
    (("-h",), "lists no principals"),
    (("-n", HOST), "user certificate"),
])
def test_a_failing_certificate_is_refused_even_when_new_keys_are_accepted(
    ca: Path, host: Path, tmp_path: Path, opts: tuple[str, ...], why: str
) -> None:
    known, path = known_hosts(tmp_path, ca_line(ca))
    before = path.read_text()
    with pytest.raises(HostKeyRefused, match=why):
        accept(known, HOST, shown(sign(ca, host, *opts)), accept_new=True)
    assert path.read_text() == before and known.keys.lookup(HOST) is None


def test_a_certificate_from_another_ca_is_refused(ca: Path, host: Path,
                                                  tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_ca")
    known, _ = known_hosts(tmp_path, ca_line(ca))
    with pytest.raises(HostKeyRefused, match=r"signed by a CA not trusted for .*name other CAs"):
        accept(known, HOST, shown(sign(other, host, "-h", "-n", HOST)), accept_new=True)
    # A CA listed for other hosts only is no CA of this one.
    known, _ = known_hosts(tmp_path, ca_line(ca, "*.elsewhere.example"))
    with pytest.raises(HostKeyRefused, match="no @cert-authority line names it"):
        accept(known, HOST, shown(sign(ca, host, "-h", "-n", HOST)), accept_new=True)


def test_revoked_keys_and_cas_are_refused(ca: Path, host: Path, tmp_path: Path) -> None:
    key = shown(sign(ca, host, "-h", "-n", HOST))
    host_line = ca_line(host, "*", "@revoked")
    known, _ = known_hosts(tmp_path, ca_line(ca), host_line)
    with pytest.raises(HostKeyRefused, match="@revoked"):
        accept(known, HOST, key, accept_new=True)
    known, _ = known_hosts(tmp_path, ca_line(ca), ca_line(ca, "*", "@revoked"))
    with pytest.raises(HostKeyRefused, match=r"its CA ssh-ed25519 SHA256:.* is @revoked"):
        accept(known, HOST, key, accept_new=True)
    # A revoked plain key is refused though a plain line lists it too, and never taken new.
    kind, blob = pub(host)
    plain = paramiko.PKey.from_type_string(kind, blob)
    line = f"{HOST} {kind} {base64.b64encode(blob).decode()}"
    known, _ = known_hosts(tmp_path, line, host_line)
    with pytest.raises(HostKeyRefused, match="@revoked"):
        accept(known, HOST, plain)
    known, _ = known_hosts(tmp_path, host_line)
    with pytest.raises(HostKeyRefused, match="@revoked"):
        accept(known, HOST, plain, accept_new=True)


def test_a_plain_key_where_a_ca_vouches(ca: Path, host: Path, tmp_path: Path) -> None:
    kind, blob = pub(host)
    plain = paramiko.PKey.from_type_string(kind, blob)
    known, _ = known_hosts(tmp_path, ca_line(ca))
    with pytest.raises(HostKeyRefused, match=r"plain host key ssh-ed25519 SHA256:.* refused"):
        accept(known, HOST, plain, accept_new=True)
    assert known.keys.lookup(HOST) is None
    # Listed for the host itself: accepted; another key listed: CHANGED, as before.
    line = f"{HOST} {kind} {base64.b64encode(blob).decode()}"
    known, _ = known_hosts(tmp_path, ca_line(ca), line)
    accept(known, HOST, plain)
    other = keygen(tmp_path / "other")
    with pytest.raises(paramiko.BadHostKeyException):
        accept(known, HOST, paramiko.PKey.from_type_string(*pub(other)))


def test_a_failing_certificate_of_a_listed_key_is_that_key(ca: Path, host: Path,
                                                           tmp_path: Path) -> None:
    # As ssh: a certificate that fails is judged again as the key it certifies, which a
    # line for that very key vouches for (never accept-new).
    kind, blob = pub(host)
    line = f"{HOST} {kind} {base64.b64encode(blob).decode()}"
    known, _ = known_hosts(tmp_path, ca_line(ca), line)
    accept(known, HOST, shown(sign(ca, host, "-h", "-n", "wrong")))


def test_a_certificate_must_hold_the_key_the_host_signed_with(ca: Path, host: Path,
                                                              tmp_path: Path) -> None:
    known, _ = known_hosts(tmp_path, ca_line(ca))
    key = shown(sign(ca, host, "-h", "-n", HOST))
    other = keygen(tmp_path / "other")
    key.public_blob = shown(sign(ca, other, "-h", "-n", HOST)).public_blob
    with pytest.raises(HostKeyRefused, match="holds another key"):
        accept(known, HOST, key)


def test_hosts_no_marker_names_keep_paramikos_check(ca: Path, host: Path,
                                                    tmp_path: Path) -> None:
    kind, blob = pub(host)
    line = f"10.2.0.7 {kind} {base64.b64encode(blob).decode()}"
    known, _ = known_hosts(tmp_path, ca_line(ca), line)
    assert known.store.get("10.2.0.7") is not None
    assert known.store.get(HOST) is None


def test_refusal_is_host_key_mismatch_naming_why(ca: Path, host: Path,
                                                 tmp_path: Path) -> None:
    known, _ = known_hosts(tmp_path, ca_line(ca))
    with pytest.raises(HostKeyRefused) as caught:
        accept(known, HOST, shown(sign(ca, host, "-h", "-n", HOST, "-V", "-2d:-1d")))
    failure = classify(caught.value, Where(HOST, 22), Phase.KEX, 0.1, 10)
    assert failure is not None and failure.kind == "host_key_mismatch"
    assert failure.message.startswith(f"{HOST}:22: host certificate refused: it expired")
    assert failure.message.endswith("nothing was run")


def test_a_vouched_host_is_asked_for_certificates_first() -> None:
    mine, theirs = socket.socketpair()
    try:
        plain = transport(mine).preferred_keys
        certs = transport(mine, certs_first=True).preferred_keys
    finally:
        mine.close()
        theirs.close()
    assert not plain[0].endswith(hostcerts.CERT_SUFFIX)
    assert certs[0] == "ssh-ed25519-cert-v01@openssh.com"
    assert sorted(plain) == sorted(certs)
    split = sum(1 for name in certs if name.endswith(hostcerts.CERT_SUFFIX))
    assert all(name.endswith(hostcerts.CERT_SUFFIX) for name in certs[:split])


def rewritten(blob: bytes, key_id: bytes = b"test", sig_type: bytes | None = None) -> bytes:
    """``blob`` (a certificate ssh-keygen made with -I test) with another key id, and
    another signature type where given: its signature no longer verifies, which is the
    point where a server chooses what it holds."""
    wire = hostcerts._Wire(blob)
    wire.string()  # type
    wire.string()  # nonce
    wire.string()  # the Ed25519 key
    wire.u64()
    wire.u32()
    at = wire.at
    old = wire.string()
    assert old == b"test"
    out = blob[:at] + struct.pack(">I", len(key_id)) + key_id + blob[wire.at:]
    if sig_type is None:
        return out
    body, sig = hostcerts._Wire(out), None
    sig_at = len(out) - len(hostcerts.parse(blob).signature) - 4
    body.at = sig_at
    sig = hostcerts._Wire(body.string())
    sig.string()
    rest = sig.string()
    signature = (struct.pack(">I", len(sig_type)) + sig_type
                 + struct.pack(">I", len(rest)) + rest)
    return out[:sig_at] + struct.pack(">I", len(signature)) + signature


def test_a_revoked_certificate_revokes_its_key_whatever_else_it_holds(
    ca: Path, host: Path, tmp_path: Path
) -> None:
    # A key id that is not UTF-8 (ssh reads it: any string without NUL) made the whole
    # @revoked certificate unreadable here, and it revoked nothing: the host's key, which
    # ssh refuses, was taken.
    good = sign(ca, host, "-h", "-n", HOST)
    revoked = rewritten(good, key_id=b"id\xff")
    line = f"@revoked * ssh-ed25519-cert-v01@openssh.com {base64.b64encode(revoked).decode()}"
    known, _ = known_hosts(tmp_path, ca_line(ca), line)
    with pytest.raises(HostKeyRefused, match="is @revoked"):
        accept(known, HOST, shown(good))
    # One whose key cannot be read at all: the hosts it names are refused.
    broken = base64.b64encode(good[:60]).decode()
    known, _ = known_hosts(tmp_path, ca_line(ca),
                           f"@revoked * ssh-ed25519-cert-v01@openssh.com {broken}")
    with pytest.raises(HostKeyRefused, match="cannot be read"):
        accept(known, HOST, shown(good))


def test_what_a_certificate_says_reaches_no_terminal_raw(ca: Path, host: Path) -> None:
    # A server chooses the signature type it sends (it needs only the CA's public key):
    # printed raw, it cleared the screen and set the window title of whoever ran status.
    forged = rewritten(sign(ca, host, "-h", "-n", HOST),
                       sig_type=b"ssh-ed25519\x1b]0;pwned\x07\r\n")
    said = problem(forged)
    assert said is not None and "\x1b" not in said and "\x07" not in said
    assert "\\x1b]0;pwned" in said


def test_revoked_host_keys_a_file_of_keys_or_a_krl(host: Path, tmp_path: Path) -> None:
    # ssh_config's RevokedHostKeys was not read: a key ssh refuses ("revoked by file") was
    # taken. A file of keys, a KRL (ssh-keygen -k; asked of ssh-keygen -Q), a file that
    # cannot be read (ssh refuses then too).
    kind, blob = pub(host)
    key = paramiko.PKey.from_type_string(kind, blob)
    listed = tmp_path / "known_hosts"
    listed.write_text(f"{HOST} {kind} {base64.b64encode(blob).decode()}\n")
    other = keygen(tmp_path / "other")
    for name, revoked in (("keys", host.with_name("host.pub")),
                          ("krl", tmp_path / "revoked.krl")):
        if name == "krl":
            subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(revoked), str(host) + ".pub"],
                           check=True, capture_output=True)
        known = KnownHosts((str(listed),), revoked=str(revoked))
        with pytest.raises(HostKeyRefused, match="revoked"):
            accept(known, HOST, key)
        kept = KnownHosts((str(listed),), revoked=str(other) + ".pub")
        accept(kept, HOST, key)  # another key's revocation: this one is taken
    gone = KnownHosts((str(listed),), revoked=str(tmp_path / "missing.krl"))
    with pytest.raises(HostKeyRefused, match="cannot be read"):
        accept(gone, HOST, key)
