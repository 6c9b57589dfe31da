"""A node's own accounts and sudo: users, passwords, sudoers, PAM, /etc/hosts. Host side.

Every node gets three login accounts besides root, each reached with the fleet's client
key and each with the fleet's one password (``STATE/sudo_password``), and a real ``sudo``
(Debian's package) configured as Debian ships it (``env_reset``, ``secure_path``,
``use_pty``, ``%sudo ALL=(ALL:ALL) ALL``; the lecture off and ``timestamp_timeout`` 15
minutes, both compiled into Debian's build), only sending no mail:

========  =====  ==============================================================
user      uid    sudo
========  =====  ==============================================================
ops       2601   ``ops ALL=(ALL:ALL) NOPASSWD: ALL`` in /etc/sudoers.d/ops
alice     2602   member of group ``sudo``: everything, with her password
bob       2603   none (not in sudoers): sudo asks his password, then refuses him
========  =====  ==============================================================

``Defaults requiretty`` is the node fault ``requiretty`` (:func:`set_requiretty`).

One more person, ``carol`` (uid 2604, no sudo), is in no node's /etc/passwd: the node knows
her only from its directory service, as a real cluster's nodes know most of their users
from LDAP or SSSD. A real NSS module serves her, Debian's ``libnss-extrausers``, from the
node's /var/lib/extrausers (``passwd: files extrausers`` in the node's own nsswitch.conf):
``getent passwd 2604`` and ``id carol`` name her, a read of /etc/passwd does not. Without
that module on this machine she does not exist (``has_directory``).

``write_etc`` writes the files under ``NODE_DIR/etc``; the node's init bind-mounts them
over ``/etc/passwd``, ``/etc/shadow``, ``/etc/sudoers`` ... inside the node's own mount
namespace (``node_init.make_accounts``), so this machine's accounts and sudo configuration
are never read by a node nor changed. System accounts (uid below 1000 or from 60000: sshd's
privilege separation user, munge, slurm) are copied from this machine, because the node
runs this machine's binaries; its own people are not.

>>> [u.name for u in USERS], user("alice").sudo
(['ops', 'alice', 'bob'], 'password')
>>> sudoers_d({"ops": "nopasswd", "alice": "password"}, requiretty=True)["requiretty"]
'# Written by fleetclean.sim: sudo needs a terminal on this node.\\nDefaults requiretty\\n'
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import secrets
import string
from dataclasses import dataclass
from pathlib import Path

SUDO = "/usr/bin/sudo"
HOME_ROOT = "/home"
# Under NODE_DIR; node_init.py names the same paths.
ETC = "etc"
SUDOERS_D = "etc/sudoers.d"


@dataclass(frozen=True)
class SimUser:
    """A person's account on every simulated node (a login one, or one only the directory
    service knows); ``sudo`` is ``nopasswd``, ``password`` or ``none``."""

    name: str
    uid: int
    sudo: str

    @property
    def home(self) -> str:
        return f"{HOME_ROOT}/{self.name}"


USERS = (SimUser("ops", 2601, "nopasswd"), SimUser("alice", 2602, "password"),
         SimUser("bob", 2603, "none"))
# Known only through the directory service (NSS), not /etc/passwd: no login, no home.
DIRECTORY_USERS = (SimUser("carol", 2604, "none"),)
# Where libnss-extrausers reads its accounts, on a node as on any machine.
EXTRAUSERS = "/var/lib/extrausers"
_EXTRAUSERS_MODULE = "libnss_extrausers.so.2"


def has_directory() -> bool:
    """Whether this machine has the NSS module that serves ``DIRECTORY_USERS``
    (``scripts/dev setup`` installs it): glibc finds it on the linker's default path."""
    return any(os.path.exists(os.path.join(d, _EXTRAUSERS_MODULE))
               for d in ("/usr/lib", "/lib", "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                         "/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib64"))


def user(name: str) -> SimUser:
    """The simulated account called ``name`` (a login account, or a directory one where
    this machine can serve it); KeyError for another name."""
    known: tuple[SimUser, ...] = USERS + (DIRECTORY_USERS if has_directory() else ())
    for candidate in known:
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def has_sudo() -> bool:
    """Whether this machine has sudo installed (``scripts/dev setup`` installs it)."""
    return os.access(SUDO, os.X_OK) and os.path.isfile("/etc/sudoers")


# Debian's /etc/sudoers, less its comments: what a freshly installed node has. One line
# more: the node runs this machine's binaries, so a refused sudo must not hand a warning
# mail (mail_badpass, mail_no_user) to this machine's MTA.
SUDOERS = """\
# Written by fleetclean.sim: Debian's default sudoers.
Defaults	env_reset
Defaults	mail_badpass
Defaults	secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Defaults	use_pty
Defaults	!mailerpath
root	ALL=(ALL:ALL) ALL
%sudo	ALL=(ALL:ALL) ALL
@includedir /etc/sudoers.d
"""

# Debian's /etc/pam.d/sudo with its common-* includes spelled out for a node that has only
# pam_unix: the host's own PAM stack (sss, ldap, systemd) is never consulted.
PAM_SUDO = """\
#%PAM-1.0
# Written by fleetclean.sim: Debian's sudo stack as common-* give it with pam_unix alone.
session    required   pam_limits.so
auth       [success=1 default=ignore]   pam_unix.so nullok
auth       requisite  pam_deny.so
auth       required   pam_permit.so
account    [success=1 new_authtok_reqd=done default=ignore]   pam_unix.so
account    requisite  pam_deny.so
account    required   pam_permit.so
session    [default=1]   pam_permit.so
session    requisite  pam_deny.so
session    required   pam_permit.so
session    required   pam_unix.so
"""


def sudoers_d(rules: dict[str, str], *, requiretty: bool) -> dict[str, str]:
    """File name -> text of the node's /etc/sudoers.d: a NOPASSWD rule per such user, and
    ``Defaults requiretty`` when asked for."""
    files = {
        name: f"# Written by fleetclean.sim.\n{name} ALL=(ALL:ALL) NOPASSWD: ALL\n"
        for name, kind in rules.items()
        if kind == "nopasswd"
    }
    if requiretty:
        files["requiretty"] = (
            "# Written by fleetclean.sim: sudo needs a terminal on this node.\n"
            "Defaults requiretty\n"
        )
    return files


_SALT_CHARS = string.ascii_letters + string.digits + "./"


def crypt_sha512(password: str) -> str:
    """A ``$6$`` hash of ``password`` for /etc/shadow, from libcrypt (what pam_unix and
    passwd(1) use; Python's crypt module is deprecated)."""
    name = ctypes.util.find_library("crypt") or "libcrypt.so.1"
    lib = ctypes.CDLL(name)
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = "$6$" + "".join(secrets.choice(_SALT_CHARS) for _ in range(16))
    out = lib.crypt(password.encode(), salt.encode())
    if not out or not out.startswith(b"$6$"):
        raise OSError("libcrypt could not make a SHA-512 password hash")
    return str(out.decode())


def _system_entries(path: str, id_field: int) -> list[str]:
    """This machine's system accounts (or groups): id below 1000 or from 60000."""
    kept = []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split(":")
            if len(fields) > id_field and fields[id_field].isdigit():
                number = int(fields[id_field])
                if number < 1000 or number >= 60000:
                    kept.append(line.rstrip("\n"))
    return kept


def _etc_texts(password_hash: str, address: str, name: str) -> dict[str, str]:
    passwd = _system_entries("/etc/passwd", 2)
    names = [line.split(":")[0] for line in passwd]
    group_lines = []
    for line in _system_entries("/etc/group", 2):
        fields = line.split(":")
        if fields[0] == "sudo":
            members = [m for m in fields[3].split(",") if m]
            fields[3] = ",".join([*members, *(u.name for u in USERS if u.sudo == "password")])
        group_lines.append(":".join(fields))
    for u in USERS:
        passwd.append(f"{u.name}:x:{u.uid}:{u.uid}:{u.name}:{u.home}:/bin/bash")
        group_lines.append(f"{u.name}:x:{u.uid}:")
    # "*": no password, yet not locked ("!" would make sshd refuse even a key).
    shadow = [f"{n}:*:19000:0:99999:7:::" for n in names]
    # Every person has the fleet's password, as on a real cluster: sudo asks even bob for
    # his before it tells him he is not in the sudoers file.
    shadow += [f"{u.name}:{password_hash}:19000:0:99999:7:::" for u in USERS]
    texts = {
        "passwd": "\n".join(passwd) + "\n",
        "group": "\n".join(group_lines) + "\n",
        "shadow": "\n".join(shadow) + "\n",
        # sudo (built --with-fqdn) resolves the node's name on every call.
        "hosts": f"127.0.0.1\tlocalhost\n{address}\t{name}\n",
        "sudoers": SUDOERS,
        "pam.d-sudo": PAM_SUDO,
    }
    if has_directory():
        texts.update(_directory_texts())
    return texts


def _directory_texts() -> dict[str, str]:
    """The node's directory service: the extrausers files and an nsswitch.conf that asks
    them after /etc's files (this machine's, with only that added)."""
    try:
        with open("/etc/nsswitch.conf") as f:
            host = f.read().splitlines()
    except FileNotFoundError:  # glibc's default without one
        host = ["hosts: files dns"]
    lines, asked = [], set()
    for line in host:
        name, colon, sources = line.partition("#")[0].partition(":")
        key = name.strip()
        if colon and key in ("passwd", "group"):
            words = sources.split()
            words += ["extrausers"] * ("extrausers" not in words)
            lines.append(f"{key}: {' '.join(words)}")
            asked.add(key)
        else:
            lines.append(line)
    lines += [f"{key}: files extrausers" for key in ("passwd", "group") if key not in asked]
    return {
        "nsswitch.conf": "\n".join(lines) + "\n",
        "extrausers/passwd": "".join(f"{u.name}:x:{u.uid}:{u.uid}:{u.name}:{u.home}:/bin/bash\n"
                                     for u in DIRECTORY_USERS),
        "extrausers/group": "".join(f"{u.name}:x:{u.uid}:\n" for u in DIRECTORY_USERS),
    }


def write_etc(node_dir: Path, name: str, address: str, password_hash: str) -> None:
    """The node's account and sudo files under ``NODE_DIR/etc`` (root's, mode as the
    real ones: sudo refuses a sudoers file others can write); ``password_hash`` is the
    accounts' password, from :func:`crypt_sha512`."""
    etc = node_dir / ETC
    etc.mkdir(mode=0o755, exist_ok=True)
    modes = {"shadow": 0o640, "sudoers": 0o440}
    for file_name, text in _etc_texts(password_hash, address, name).items():
        path = etc / file_name
        path.parent.mkdir(mode=0o755, exist_ok=True)
        path.write_text(text)
        path.chmod(modes.get(file_name, 0o644))
    (etc / "sudo-lib" / "lectured").mkdir(parents=True, mode=0o700, exist_ok=True)
    (etc / "sudo-lib").chmod(0o700)
    set_requiretty(node_dir, on=False)


def set_requiretty(node_dir: Path, *, on: bool) -> None:
    """Rewrite the node's /etc/sudoers.d (read by sudo at every call, so this takes effect
    at once inside the running node)."""
    directory = node_dir / SUDOERS_D
    directory.mkdir(mode=0o750, exist_ok=True)
    directory.chmod(0o750)
    wanted = sudoers_d({u.name: u.sudo for u in USERS}, requiretty=on)
    for old in directory.iterdir():
        if old.name not in wanted:
            old.unlink()
    for file_name, text in wanted.items():
        tmp = directory / f".{file_name}.tmp"  # sudo skips names with a dot
        tmp.write_text(text)
        tmp.chmod(0o440)
        tmp.replace(directory / file_name)


def new_password() -> str:
    """The accounts' password for one fleet: random, kept in ``STATE/sudo_password`` (0600)."""
    return secrets.token_urlsafe(12)
