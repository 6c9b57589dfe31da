"""fleetclean as a library, for hosts you already reach with fabric.

``status`` and ``run`` take fabric ``Connection``s (or a ``Group``, or any iterable of
them) and return the ``RunResult`` the CLI prints: one ``HostResult`` per host, in the
order given, with its status (``HostStatus``), its stages, GPUs and what was signalled.
``to_json(result)`` is the CLI's ``--json`` document, ``result.exit_status`` its exit status.

Example (not run here: it needs reachable hosts)::

    from fabric import Connection, Group
    from fleetclean import api

    result = api.status(Group("gpu01", "gpu02", user="root"))
    for host in result.hosts:
        print(host.host, host.status.value, [g.memory_used_mib for g in host.gpus])

    result = api.run("post-extraction", [Connection("gpu03", user="root", port=2222)],
                     variables={"grace": 5, "protect": "jupyter"})
    if result.exit_status:  # 1: some host dirty or faulty; 2: some host not reached
        print(api.to_json(result)["summary"])

How a connection is used:

- each is opened (unless it is open already) with fleetclean's host-key policy, on it and
  on a ``Connection`` gateway: a key that ``~/.ssh/known_hosts`` (or ``known_hosts``) does
  not list is refused with its fingerprint unless ``accept_new_host_keys``, a changed key is
  always refused; keys you added to the connection's client yourself count as known;
- each phase of the connection gets ``connect_timeout`` unless you set one on it; new
  connections to one sshd are paced and the ones it drops (MaxStartups) retried;
- the route is the connection's own (``gateway=``); give host names to the CLI (or an
  inventory) for fleetclean's own jump-host handling through ssh_config;
- at most ``forks`` hosts run at once, on that many threads (fabric's ``ThreadingGroup``
  starts one per host), each script read by fleetclean's own loop (no ``run`` threads);
- every connection is left as it was found: open if it was open, closed if fleetclean
  opened it.

Bad input (an unknown playbook, a variable of the wrong type, two connections with one
name) raises a ``fleetclean.errors.FleetcleanError`` before any host is contacted; what
happens on a host is never an exception but that host's ``HostResult``.

>>> status([])
RunResult(playbook='status', duration_s=0.0, hosts=(), interrupted=False)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleetclean.errors import UsageError
from fleetclean.fleet import EventCallback, Job, run_fleet
from fleetclean.models import Host, HostResult, HostStatus, RunResult

__all__ = ["HostResult", "HostStatus", "RunResult", "run", "status", "to_json"]

DEFAULT_FORKS = 64


def status(
    hosts: Iterable[Any],
    *,
    variables: Mapping[str, Any] | None = None,
    forks: int = DEFAULT_FORKS,
    connect_timeout: float = 10.0,
    timeout: float = 300.0,
    known_hosts: Iterable[str] = (),
    accept_new_host_keys: bool = False,
    on_event: EventCallback | None = None,
) -> RunResult:
    """The read-only GPU status of every host (the ``status`` playbook)."""
    return run("status", hosts, variables=variables, forks=forks,
               connect_timeout=connect_timeout, timeout=timeout, known_hosts=known_hosts,
               accept_new_host_keys=accept_new_host_keys, on_event=on_event)


def run(
    playbook: str,
    hosts: Iterable[Any],
    *,
    variables: Mapping[str, Any] | None = None,
    check: bool = False,
    force: bool = False,
    forks: int = DEFAULT_FORKS,
    connect_timeout: float = 10.0,
    timeout: float = 300.0,
    known_hosts: Iterable[str] = (),
    accept_new_host_keys: bool = False,
    on_event: EventCallback | None = None,
) -> RunResult:
    """Run ``playbook`` (a built-in name such as ``post-extraction``, or a file) on every
    host; ``variables`` as the CLI's ``-e``, ``check`` as ``--check`` (list what would be
    signalled or changed, change nothing), ``on_event`` gets each host's progress."""
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.render import Renderer
    from fleetclean.engine.variables import resolve
    from fleetclean.transport import Options

    if forks < 1:
        raise UsageError(f"forks must be at least 1, not {forks}")
    named = _named(hosts)
    book = load_playbook(playbook)
    extra = dict(variables or {})
    renderer = Renderer()
    resolved = resolve(book, {}, extra)
    jobs = []
    for name, conn in named:
        host = Host(name, str(conn.host), port=int(conn.port), user=conn.user)
        jobs.append(Job(host, renderer.pieces(resolved, check=check, force=force,
                                              host_name=name)))
    opts = Options(connect_timeout=connect_timeout, timeout=timeout,
                   known_hosts=tuple(known_hosts), accept_new_host_keys=accept_new_host_keys)
    if not jobs:
        return RunResult(playbook=book.name, duration_s=0.0, hosts=())
    from fleetclean.transport import limits
    from fleetclean.transport.session import Session

    # Fitted here, once: run_fleet takes a Fit, and a caller's session's forks, as they are.
    fit = limits.fit_forks(min(forks, len(jobs)))
    with Session(opts) as session:
        for name, conn in named:
            session.adopt(name, conn)
        return run_fleet(jobs, playbook=book.name, opts=opts, forks=fit,
                         on_event=on_event, session=session)


def to_json(result: RunResult) -> dict[str, Any]:
    """The CLI's ``--json`` document for ``result``."""
    from fleetclean.results import jsonio

    doc: dict[str, Any] = jsonio.to_json(result)
    return doc


def _named(hosts: Iterable[Any]) -> list[tuple[str, Any]]:
    """Each connection with the name its result carries: the host as written
    (``original_host``), with its port when two connections share a host."""
    conns = list(hosts)
    for conn in conns:
        if not hasattr(conn, "original_host") or not hasattr(conn, "client"):
            raise UsageError(f"{conn!r} is not a fabric Connection",
                             hint="pass fabric.Connection objects or a fabric.Group")
    seen: dict[str, int] = {}
    for conn in conns:
        seen[conn.original_host] = seen.get(conn.original_host, 0) + 1
    named = [(c.original_host if seen[c.original_host] == 1 else f"{c.original_host}:{c.port}",
              c) for c in conns]
    names = [n for n, _ in named]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"two connections to {twice[0]}", hint="give each host once")
    return named
