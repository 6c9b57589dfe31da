"""SSH settings of one host: inventory connection variables over ``~/.ssh/config``.

Two jobs, both about what ``ssh`` itself would do:

- :func:`parse_ssh_args` reads ``ansible_ssh_common_args`` / ``ansible_ssh_extra_args``:
  ``-o Key=Value`` (or ``-o 'Key Value'``, or ``-o Key Value``) into lower-cased options,
  ``-J bastion`` / ``-o ProxyJump=bastion`` into the jump host, ``-F file`` into a config file.
  Other ssh flags (``-C``, ``-q``, ...) change nothing fleetclean does, so they are skipped.
- :func:`merge` fills what the inventory left open from an ssh config file read by
  ``paramiko.SSHConfig`` (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile,
  HostKeyAlias...). The inventory always wins, as in Ansible; its user is ssh's ``-l``, which
  ``Match user`` blocks are judged with.

Config blocks are matched against the name ``ssh`` would be given: ``ansible_host`` when the
inventory sets it, else the inventory name. So ``Host *.lab`` applies to ``gpu01.lab``, and a
``Host 10.0.0.*`` block applies to a host whose ``ansible_host`` is ``10.0.0.5``.

>>> args = parse_ssh_args("-o ProxyJump=ops@bastion -o StrictHostKeyChecking=yes")
>>> args.proxy_jump, args.options
('ops@bastion', {'stricthostkeychecking': 'yes'})
>>> parse_ssh_args("-o")
Traceback (most recent call last):
...
fleetclean.inventory.ssh_settings.SshArgsError: '-o' at the end of the ssh arguments has no option
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetclean.errors import InventoryError
from fleetclean.inventory.builder import port_number

if TYPE_CHECKING:
    from fleetclean.transport.upstream import SSHConfig

__all__ = [
    "SshArgs",
    "SshArgsError",
    "SshSettings",
    "default_config_path",
    "load_config",
    "merge",
    "parse_ssh_args",
]

ENV_CONFIG = "FLEETCLEAN_SSH_CONFIG"


class SshArgsError(ValueError):
    """Unreadable ssh arguments; the caller adds the file and line they came from."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class SshArgs:
    """What fleetclean takes from an ssh command line."""

    options: dict[str, str] = field(default_factory=dict)
    proxy_jump: str | None = None
    config_file: str | None = None
    # -l / -o User, -p / -o Port, -o HostName: below the inventory's own variables (Ansible
    # puts its -o User= and -o Port= first, and ssh keeps the first), above the config.
    user: str | None = None
    port: int | None = None
    hostname: str | None = None
    identities: tuple[str, ...] = ()  # -i and -o IdentityFile, in order

    def then(self, later: SshArgs) -> SshArgs:
        """These arguments with ``later`` after them on one command line, as
        :func:`parse_ssh_args` reads one: the first value of an option wins (``-F``: the
        last), identity files add up."""
        return SshArgs(
            options={**later.options, **self.options},
            proxy_jump=self.proxy_jump or later.proxy_jump,
            config_file=later.config_file or self.config_file,
            user=self.user or later.user,
            port=self.port or later.port,
            hostname=self.hostname or later.hostname,
            identities=(*self.identities, *later.identities),
        )


_FLAGS = ("-o", "-J", "-F", "-l", "-p", "-i")
_WHAT = {"-o": "option", "-J": "jump host", "-F": "file", "-l": "user", "-p": "port",
         "-i": "identity file"}
_HOW = {"-o": "write -o Key=Value", "-J": "write -J user@bastion",
        "-F": "write -F path/to/ssh_config", "-l": "write -l USER", "-p": "write -p PORT",
        "-i": "write -i path/to/key"}


def parse_ssh_args(text: str) -> SshArgs:
    """Read ``-o``, ``-J``, ``-F``, ``-l``, ``-p`` and ``-i`` from ssh arguments. As ssh
    reads them, the first value of each option wins (``-F``: the last), and every identity
    file is kept.

    >>> a = parse_ssh_args("-l ops -p 2222 -i ~/.ssh/a -o IdentityFile=/k/b -o HostName=h1 "
    ...                    "-o User=late -o StrictHostKeyChecking=yes -o stricthostkeychecking=no")
    >>> a.user, a.port, a.hostname, a.identities[1:], a.options
    ('ops', 2222, 'h1', ('/k/b',), {'stricthostkeychecking': 'yes'})
    """
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise SshArgsError(
            f"cannot split ssh arguments: {err}", hint="close the quote or drop it"
        ) from None
    options: dict[str, str] = {}
    given: dict[str, str] = {}  # -J, -F, -l, -p and their -o forms, by flag
    identities: list[str] = []
    jumps: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, attached = word[:2], word[2:]
        if flag not in _FLAGS:
            i += 1
            continue
        if attached:
            value = attached
        elif i + 1 < len(words):
            i += 1
            value = words[i]
        else:
            raise SshArgsError(f"'{flag}' at the end of the ssh arguments has no "
                               f"{_WHAT[flag]}", hint=_HOW[flag])
        if flag == "-J" and jumps:
            raise SshArgsError("only one -J is allowed in the ssh arguments, as for ssh",
                               hint=f"join the jump hosts with commas: -J {jumps[0]},{value}")
        if flag == "-J":
            jumps.append(value)
        if flag == "-o":
            key, value, consumed = _split_option(value, words[i + 1 :])
            i += consumed
            flag = _OPTION_FLAGS.get(key, "")
            if not flag:
                options.setdefault(key, value)
        if flag == "-i":
            identities.append(os.path.expanduser(value))
        elif flag == "-F":
            given[flag] = value
        elif flag:
            given.setdefault(flag, value)
        i += 1
    return SshArgs(options=options, proxy_jump=given.get("-J"), config_file=given.get("-F"),
                   user=given.get("-l"), port=_port(given["-p"]) if "-p" in given else None,
                   hostname=given.get("-H"), identities=tuple(identities))


# The -o options that are also flags (HostName has none: "-H" stands for it here).
_OPTION_FLAGS = {"proxyjump": "-J", "user": "-l", "port": "-p", "identityfile": "-i",
                 "hostname": "-H"}


def _port(text: str) -> int:
    port = port_number(text)
    if port is not None:
        return port
    raise SshArgsError(f"port '{text}' in the ssh arguments is not a port number",
                       hint="use a number from 1 to 65535")


def _split_option(text: str, rest: list[str]) -> tuple[str, str, int]:
    """``Key=Value`` / ``Key Value`` / ``Key`` + next word -> (key, value, words consumed)."""
    key, sep, value = text.partition("=")
    if not sep:
        key, _, value = text.strip().partition(" ")
    key, value = key.strip().lower(), value.strip()
    if not key:
        raise SshArgsError(f"'-o {text}' has no option name", hint="write -o Key=Value")
    if value:
        return key, value, 0
    # "-o Key Value" unquoted: ssh itself would fail, but the intent is plain.
    if rest and not rest[0].startswith("-"):
        return key, rest[0], 1
    raise SshArgsError(f"'-o {text}' has no value", hint=f"write -o {text.strip()}=VALUE")


@dataclass(frozen=True)
class SshSettings:
    """Where and how to reach one host after the merge; ``port`` is always set."""

    address: str
    port: int
    user: str | None
    key: str | None
    proxy_jump: str | None
    options: dict[str, str]
    identities: tuple[str, ...] = ()  # every identity file, key first; () where key alone


def default_config_path() -> str | None:
    """``$FLEETCLEAN_SSH_CONFIG`` (empty: none), else ``~/.ssh/config`` if it exists (read
    with ssh's system-wide file after it), else that system-wide file if there is one
    (``transport.system``)."""
    from fleetclean.transport import system

    env = os.environ.get(ENV_CONFIG)
    if env is not None:
        return env or None
    path = os.path.expanduser("~/.ssh/config")
    return path if os.path.isfile(path) else system.config_file()


def load_config(path: str, *, given_by: str = "ssh config", system_after: bool = False,
                said: list[str] | None = None) -> SSHConfig:
    """Parse one ssh config file (``system_after``: with ssh's system-wide one after it,
    where the run named none); a missing or unreadable one is an ``InventoryError``. A
    system-wide one that paramiko cannot parse is left out, and said (into ``said``):
    ssh may read it well, and it is not the user's to fix."""
    # The transport owns paramiko and its ssh_config reader (Include expanded), which its
    # connections follow, so hosts are resolved as they will be reached. Imported here, not
    # at the top: reading an inventory without an ssh config never loads paramiko.
    from fleetclean.transport.hops import ConfigParseError, SystemConfigError
    from fleetclean.transport.hops import load_config as load_with_includes

    if not os.path.exists(path):
        raise InventoryError(
            f"{given_by} file does not exist", path=path, hint="fix the path or remove it"
        )
    if os.path.isdir(path):
        raise InventoryError(
            f"{given_by} file is a directory", path=path, hint="give the config file itself"
        )
    try:
        return load_with_includes(path, system_after)
    except SystemConfigError as err:
        if said is not None:
            said.append(f"{err.path}: ssh's system-wide config cannot be read here ({err}): "
                        "left out; set what it says for these hosts in ~/.ssh/config, or "
                        "FLEETCLEAN_SSH_SYSTEM_DIR= (empty) to leave it unread and unsaid")
        return load_config(path, given_by=given_by)
    except (OSError, UnicodeDecodeError) as err:
        raise InventoryError(
            f"cannot read {given_by} file: {err}", path=path, hint="check its permissions"
        ) from None
    except ConfigParseError as err:
        raise InventoryError(
            f"cannot parse {given_by} file: {err}",
            path=path,
            hint="each line must be 'Keyword value'",
        ) from None


def merge(
    name: str,
    *,
    host: str | None,
    port: int | None,
    user: str | None,
    key: str | None,
    proxy_jump: str | None,
    options: dict[str, str],
    config: SSHConfig | None,
    config_path: str | None = None,
    hostname: str | None = None,
    identities: tuple[str, ...] = (),
) -> SshSettings:
    """Fill unset inventory values from ``config``; inventory values always win.
    ``hostname`` and ``identities``: ``-o HostName`` and ``-i`` of the ssh arguments, which
    come before the config's as on ssh's command line.

    >>> from fleetclean.transport.hops import parse_config
    >>> cfg = parse_config("Host gpu01\\n  HostName 10.0.0.1\\n  Port 2222")
    >>> s = merge("gpu01", host=None, port=None, user="root", key=None, proxy_jump=None,
    ...           options={}, config=cfg)
    >>> (s.address, s.port, s.user)
    ('10.0.0.1', 2222, 'root')
    """
    target = host or name
    # The inventory's user is ssh's command-line user (Ansible writes -o User=): it is the
    # user `Match user` blocks are judged with, as `ssh -l` (upstream.SSHConfig.lookup).
    found: dict[str, object] = (dict(config.lookup(target, user=user)) if config is not None
                                else {})
    config_port = found.get("port")
    if port is None and isinstance(config_port, str):
        port = _config_port(config_port, target, config_path)
    # ssh tries every identity file, the command line's before the config's, and stops at
    # the first the host accepts; the inventory's key is Ansible's first -o IdentityFile.
    listed = found.get("identityfile")
    files = [key] if key else []
    files += [*identities, *(os.path.expanduser(str(f)) for f in
                             (listed if isinstance(listed, list) else ()))]
    keys = tuple(dict.fromkeys(files))
    key = keys[0] if keys else None
    config_user = found.get("user")
    if user is None and isinstance(config_user, str):
        user = config_user
    config_jump = found.get("proxyjump")
    # "ProxyJump none" is ssh's way to switch an inherited jump host off. ProxyJump and
    # ProxyCommand exclude each other and ssh keeps the first it reads: a ProxyCommand of
    # the ssh arguments (the command line) comes before any of the config's.
    if (proxy_jump is None and "proxycommand" not in options and isinstance(config_jump, str)
            and config_jump.lower() != "none"):
        proxy_jump = config_jump
    merged = dict(options)
    # ProxyCommand from the config, unless a ProxyJump (found first by ssh) already decides.
    command = found.get("proxycommand")
    if proxy_jump is None and "proxycommand" not in merged and isinstance(command, str):
        merged["proxycommand"] = command
    for option in ("userknownhostsfile", "globalknownhostsfile", "revokedhostkeys"):
        known_hosts = found.get(option)
        if option not in merged and isinstance(known_hosts, str):
            merged[option] = " ".join(os.path.expanduser(f) for f in known_hosts.split())
    # Whether the agent's keys are offered, whether a new host key is written hashed, and
    # the name known_hosts knows the host by.
    for option in ("identitiesonly", "identityagent", "hashknownhosts", "hostkeyalias"):
        if option not in merged and isinstance(found.get(option), str):
            merged[option] = str(found[option])
    config_hostname = found.get("hostname")
    # ssh resolves the name it was given through HostName, ansible_host included; a
    # -o HostName of the ssh arguments comes first.
    address = hostname or (config_hostname if isinstance(config_hostname, str)
                           and config_hostname else target)
    return SshSettings(
        address=address,
        port=22 if port is None else port,
        user=user,
        key=key,
        proxy_jump=proxy_jump,
        options=merged,
        identities=keys if len(keys) > 1 else (),
    )


def _config_port(text: str, target: str, config_path: str | None) -> int:
    port = port_number(text)
    if port is not None:
        return port
    raise InventoryError(
        f"Port '{text}' for host '{target}' is not a port number",
        path=config_path,
        hint="use a number from 1 to 65535",
    )
