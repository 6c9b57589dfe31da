"""Where a connection goes: the host itself, and the jump hosts in front of it.

Every hop is resolved the way OpenSSH resolves it, through the ssh_config the inventory read
for the host: ``ProxyJump a,b,c`` (each hop's HostName, User, Port, IdentityFile,
UserKnownHostsFile, StrictHostKeyChecking and HostKeyAlias, and the first hop's own
ProxyJump),
``ProxyJump user@host:port``, ``ProxyJump none``, ``ProxyCommand`` (``%h``, ``%p``, ``%r``,
``%n`` expanded) and ``Include``. fabric resolves none of this reliably (see ``pool``), so
fleetclean does it here and gives fabric finished sockets.

>>> cfg = parse_config("Host b1\\n  HostName 10.0.0.1\\n  User ops\\n  Port 2201\\n")
>>> route = resolve(Target("gpu01", "10.1.0.1", 22, "root", None, {}), "b1,root@b2:22",
...                 cfg)
>>> [(h.name, h.address, h.port, h.user) for h in route.hops]
[('b1', '10.0.0.1', 2201, 'ops'), ('b2', 'b2', 22, 'root')]

A hop's keys are its own, as the ``ssh -W`` that ssh runs for it reads them: its IdentityFile,
else ssh's default files (``keys`` empty), never the host's (the inventory's key is for the
nodes):

>>> route = resolve(Target("gpu01", "10.1.0.1", 22, "root", "/k/cluster", {}), "b1", cfg)
>>> route.hops[0].keys
()
>>> resolve(Target("gpu01", "10.1.0.1", 22, "root", None, {}), "none", cfg).hops
()
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from fleetclean.transport import system
from fleetclean.transport.base import Failed, TransportFailure
from fleetclean.transport.includes import expand_file
from fleetclean.transport.sshlib import paramiko
from fleetclean.transport.upstream import SSHConfig

MAX_HOPS = 8  # a ProxyJump that names itself, directly or not, ends here
# A jump host's own ssh_config settings that fleetclean follows beside where it is.
AUTH_OPTIONS = ("stricthostkeychecking", "identitiesonly", "identityagent", "hashknownhosts",
                "hostkeyalias")


Ident = tuple[str, int, str | None, tuple[str, ...], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Target:
    """One SSH endpoint: a host of the inventory or a jump host in front of it."""

    name: str  # as the user wrote it (inventory name or ProxyJump alias)
    address: str
    port: int
    user: str | None
    key: str | None  # the first identity file: the one people name in messages
    options: dict[str, str] = field(default_factory=dict, compare=False)
    # Every identity file, in the order ssh tries them (key first); () where key is the one.
    identities: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def keys(self) -> tuple[str, ...]:
        return self.identities or ((self.key,) if self.key else ())

    @property
    def agent(self) -> bool:
        """Whether ssh would offer the agent's keys too: unless IdentitiesOnly (only the
        files given) or IdentityAgent none, whether or not identity files are given."""
        only = self.options.get("identitiesonly", "no").lower() in ("yes", "true")
        return not only and self.options.get("identityagent", "").lower() != "none"

    @property
    def ident(self) -> Ident:
        """What one connection to this endpoint is shared by (a jump host's, by every host
        behind it): where it is, who logs in with which keys, and its own settings that
        decide how its key is judged (HostKeyAlias, the known_hosts files,
        StrictHostKeyChecking...) and how it is reached: two hosts whose configs judge a
        bastion apart (per-host -F files) do not share a connection one of them refuses.
        ``_hop`` fills the options in one order, so equal settings give equal keys (a
        different order would only cost the sharing), and they are not sorted (a
        microsecond a host behind a bastion)."""
        return (self.address, self.port, self.user, self.keys, tuple(self.options.items()))


@dataclass(frozen=True)
class Route:
    """Jump hosts in order, and the command whose stdio reaches the first connection."""

    hops: tuple[Target, ...] = ()
    proxy_command: str | None = None


ConfigParseError = paramiko.ssh_exception.ConfigParseError
"""What a malformed ssh_config raises, for callers that do not import paramiko."""


def parse_config(text: str) -> SSHConfig:
    config: SSHConfig = SSHConfig.from_text(text)
    return config


def load_config(path: str, system_after: bool = False) -> SSHConfig:
    """One ssh config file with its Includes; the inventory already checked it exists.
    ``system_after``: the run named no config (ssh's ``-F``), so ssh's system-wide one is
    read after it, as ssh reads them (see ``system``); where that is ``path`` itself (the
    user has none), it alone, its Includes under its own directory. A system-wide file that
    cannot be read raises ``SystemConfigError``, which names it."""
    wide = system.config_file() if system_after else None
    if wide is not None and os.path.realpath(path) == os.path.realpath(wide):
        return parse_config(_system_text(wide))
    text = expand_file(path)
    if wide is not None:
        # The user's file may end inside a Host or Match block: the system file's lines
        # before its own first block apply to every host, as they do in ssh.
        text += "\nHost *\n" + _system_text(wide)
    return parse_config(text)


class SystemConfigError(ConfigParseError):
    """ssh's system-wide config could not be read or parsed; ``path`` names it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(reason)
        self.path = path


def _system_text(path: str) -> str:
    try:
        text = expand_file(path, base=os.path.dirname(path))
        parse_config(text)  # fails here, where the file can be named
    except (OSError, UnicodeDecodeError, ConfigParseError) as err:
        raise SystemConfigError(path, str(err)) from None
    return text


class Configs:
    """Each ssh config file parsed once per run."""

    @staticmethod
    def _without(path: str) -> SSHConfig:
        try:
            return load_config(path)
        except (OSError, paramiko.ssh_exception.ConfigParseError):
            return SSHConfig()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, bool], SSHConfig] = {}

    def get(self, path: str | None, system_after: bool = False) -> SSHConfig | None:
        if not path:
            return None
        key = (path, system_after)
        with self._lock:
            if key not in self._cache:
                try:
                    self._cache[key] = load_config(path, system_after)
                except SystemConfigError:  # said by the inventory, which read it without
                    self._cache[key] = self._without(path)
                except (OSError, paramiko.ssh_exception.ConfigParseError):
                    self._cache[key] = SSHConfig()
            return self._cache[key]


def _split_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (or ``ssh://…``) -> (user, host, port)."""
    spec = spec.removeprefix("ssh://")
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6]:port
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
    elif rest.count(":") == 1:
        host, _, text = rest.partition(":")
        if not text.isdigit():
            raise Failed(TransportFailure("error", f"ProxyJump '{spec}': port is not a number"))
        port = int(text)
    return user or None, host, port


def _hop(spec: str, config: SSHConfig | None, lender: Target) -> tuple[Target, str]:
    """One jump host and its own ProxyJump from the config ('' when none)."""
    user, alias, port = _split_spec(spec)
    # ssh reaches a jump host with an `ssh -W` of its own (ssh.c: only -l, -p, -J and -F
    # are passed on), which reads the config for the hop's name, judging `Match user` with
    # the spec's user, and offers the hop's IdentityFile, else ~/.ssh/id_* (paramiko's
    # look_for_keys, where keys are empty), and the agent's keys: never the host's own
    # (the inventory's key, -i, the host's IdentityFile), which a bastion may not accept
    # and should not see.
    found = config.lookup(alias, user=user) if config is not None else {}
    keys = tuple(os.path.expanduser(f) for f in found.get("identityfile") or ())
    options = {k: str(found[k]) for k in AUTH_OPTIONS if k in found}
    own_jump = str(found.get("proxyjump", ""))
    command = found.get("proxycommand")
    if _is_none(own_jump) and isinstance(command, str) and not _is_none(command):
        # How ssh reaches this hop when it is the first (ssh -W runs with its config): the
        # pool uses it there only; a later hop is reached through the one before it.
        options["proxycommand"] = command
    for option in ("userknownhostsfile", "globalknownhostsfile", "revokedhostkeys"):
        known = found.get(option)
        options[option] = (
            os.path.expanduser(str(known)) if known else lender.options.get(option, "")
        )
    hop = Target(
        name=alias,
        address=str(found.get("hostname") or alias),
        port=port or int(found.get("port", 22)),
        user=user or found.get("user"),
        key=keys[0] if keys else None,
        options={k: v for k, v in options.items() if v},
        identities=keys,
    )
    return hop, own_jump


def _is_none(spec: str | None) -> bool:
    return not spec or spec.strip().lower() == "none"


def expand(command: str, target: Target) -> str:
    """ssh's ProxyCommand tokens.

    >>> expand("ssh -W %h:%p b %%", Target("n", "10.0.0.5", 2222, "root", None))
    'ssh -W 10.0.0.5:2222 b %'
    """
    tokens = {"h": target.address, "p": str(target.port), "r": target.user or "", "n": target.name}
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            nxt = command[i + 1]
            out.append("%" if nxt == "%" else tokens.get(nxt, "%" + nxt))
            i += 2
            continue
        out.append(command[i])
        i += 1
    return "".join(out)


def pace_key(command: str, target: Target) -> str:
    """The ProxyCommand with this target's own name, address and port taken out: the same
    for every host that goes through the same bastion, whose sshd's MaxStartups they then
    share (ssh_config's tokens arrive already expanded).

    >>> pace_key("ssh -W 10.0.0.5:22 bastion", Target("n5", "10.0.0.5", 22, None, None))
    'ssh -W %h:%p bastion'
    >>> pace_key("ssh -W n5:22 jump -l ops", Target("n5", "10.0.0.5", 22, None, None))
    'ssh -W %n:%p jump -l ops'
    """
    tokens = ((f"{target.address}:{target.port}", "%h:%p"), (f"{target.name}:{target.port}",
              "%n:%p"), (target.address, "%h"), (target.name, "%n"))
    words = []
    for word in command.split():
        mine, token = next(((m, t) for m, t in tokens
                            if word == m or word.endswith(("@" + m, "=" + m))), ("", ""))
        words.append(word[: len(word) - len(mine)] + token if mine else word)
    return " ".join(words)


def resolve(
    target: Target, jump: str | None, config: SSHConfig | None, depth: int = 0
) -> Route:
    """The route to ``target``: ``jump`` (a ProxyJump value) resolved hop by hop, else the
    target's ProxyCommand. ``none`` switches either off (fabric reads it as a host name,
    fabric#2354)."""
    if _is_none(jump):
        command = target.options.get("proxycommand")
        if _is_none(command):
            return Route()
        assert command is not None
        return Route(proxy_command=expand(command, target))
    assert jump is not None
    hops: list[Target] = []
    pending = [s.strip() for s in jump.split(",") if s.strip()]
    first_jump = ""
    for i, spec in enumerate(pending):
        hop, own_jump = _hop(spec, config, target)
        hops.append(hop)
        if i == 0:
            first_jump = own_jump
    if not _is_none(first_jump) and depth < MAX_HOPS:
        # The first hop's own ProxyJump comes in front of it, as `ssh -J` would do.
        before = resolve(hops[0], first_jump, config, depth + 1)
        hops[:0] = [h for h in before.hops if h.ident != hops[0].ident]
    if len(hops) > MAX_HOPS:
        raise Failed(TransportFailure("error", f"ProxyJump chain longer than {MAX_HOPS} hops"))
    return Route(hops=tuple(hops))
