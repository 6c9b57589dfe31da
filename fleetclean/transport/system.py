"""ssh's system-wide files, which ``ssh`` reads after the user's own.

Sites put what every user of a machine needs here: a cluster's host keys in
``ssh_known_hosts`` (a login node's lists every compute node, so that no one is asked to
trust a key), its jump hosts and user names in ``ssh_config``. ``ssh node07`` then just
works on that machine; fleetclean reads the same files, the way ssh does:

- ``ssh_config`` after ``~/.ssh/config``, where the first value of each setting wins, so the
  user's own come first; not read when the run names its config (ssh's ``-F``:
  ``-F`` in ``ansible_ssh_common_args``, or ``FLEETCLEAN_SSH_CONFIG``), as ssh skips it then;
- ``ssh_known_hosts`` and ``ssh_known_hosts2`` (``GlobalKnownHostsFile``'s default, which a
  config may change) after the user's known_hosts; read, never written.

Another OpenSSH build keeps them elsewhere (Homebrew's: ``/opt/homebrew/etc/ssh``, one built
from source: ``/usr/local/etc/ssh``): ``FLEETCLEAN_SSH_SYSTEM_DIR`` names that directory; set
empty, no system-wide file is read (the tests run so, away from the machine's own).

>>> known_hosts_files({ENV_DIR: "/opt/homebrew/etc/ssh"})
('/opt/homebrew/etc/ssh/ssh_known_hosts', '/opt/homebrew/etc/ssh/ssh_known_hosts2')
>>> known_hosts_files({ENV_DIR: ""}), config_file({ENV_DIR: ""}), directory({})
((), None, '/etc/ssh')
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENV_DIR = "FLEETCLEAN_SSH_SYSTEM_DIR"
DEFAULT_DIR = "/etc/ssh"  # OpenSSH's SSHDIR as Linux distributions and macOS build it


def directory(env: Mapping[str, str] = os.environ) -> str | None:
    """Where ssh's system-wide files are; None where the run reads none."""
    return env.get(ENV_DIR, DEFAULT_DIR) or None


def config_file(env: Mapping[str, str] = os.environ) -> str | None:
    """The system-wide ssh_config, where there is one."""
    where = directory(env)
    path = os.path.join(where, "ssh_config") if where else None
    return path if path is not None and os.path.isfile(path) else None


def known_hosts_files(env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``GlobalKnownHostsFile``'s default: both of ssh's names, whether or not they exist
    (a missing one reads as empty, as in ssh)."""
    where = directory(env)
    if where is None:
        return ()
    return tuple(os.path.join(where, name) for name in ("ssh_known_hosts", "ssh_known_hosts2"))
