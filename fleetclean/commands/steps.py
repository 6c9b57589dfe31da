"""Steps every command that reaches hosts shares: select the hosts, check the connection
options, render every host's script before anything is sent."""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING, Any

from fleetclean.commands import become
from fleetclean.commands.env import Env, error_line
from fleetclean.errors import UsageError
from fleetclean.models import Host

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from fleetclean import fleet
    from fleetclean.engine.model import ResolvedPlaybook, Scope
    from fleetclean.slurm.nodes import Runner
    from fleetclean.transport import Options, limits


def select_hosts(args: argparse.Namespace, env: Env, *, warn: bool = False) -> list[Host]:
    """The hosts ``-i``/``-l`` select, with the command line's become settings; ``warn``:
    print the inventory's warnings (a readable password) on stderr."""
    from fleetclean.inventory import load_inventory, local_inventory

    ssh_config = ssh_config_of(args, env)
    if args.limit is not None and not args.limit.strip():
        # `-l "$HOSTS"` with HOSTS unset must not mean every host of the fleet.
        raise UsageError("-l/--limit is empty, which would select every host",
                         hint="leave -l out (or write -l all) to mean every host")
    cli_become = become.defaults(args)
    if args.local:
        if args.inventory or args.connection == "ssh":
            raise UsageError("--local is this machine alone, without SSH or an inventory",
                             hint="drop -i/-c, or use -i SOURCE -c local")
        inv = local_inventory(cli_become)
    else:
        sources = inventory_sources(args, env)
        if not sources:
            raise UsageError("no inventory given",
                             hint="give -i lab.yml or -i 'gpu01,gpu02,', --local for this "
                             "machine, or set FLEETCLEAN_INVENTORY")
        inv = load_inventory(sources, ssh_config=ssh_config, defaults=cli_become,
                             login=lambda source: login_runner(args, env, source))
    if args.connection:
        inv = inv.with_connection(args.connection)
    hosts = inv.select(args.limit)
    for warning in inv.warnings if warn else ():
        error_line(env, f"fleetclean: warning: {warning}")
    return hosts


def fitted_forks(args: argparse.Namespace, env: Env, hosts: int,
                 keep: bool = False) -> limits.Fits:
    """``--forks`` (no more than the ``hosts``), or as many hosts at once as the limits on
    open files and threads leave room for, and with ``keep`` (``status --watch``) how many
    hosts' connections may be kept between refreshes beside them: the limits read once
    (``limits.fit_run``; ``fleet.run_fleet`` takes the fit as it is), each cut said once
    on stderr."""
    from fleetclean.transport import limits

    wanted = max(1, min(args.forks, hosts))
    fits = limits.fit_run(wanted, hosts if keep else 0)
    if fits.forks.n < wanted:
        error_line(env, f"fleetclean: warning: {fits.forks.by} leaves room for "
                        f"{fits.forks.n} hosts at once: running {fits.forks.n} at a time, "
                        f"not --forks {args.forks}")
    if keep and fits.kept.n < hosts:
        error_line(env, f"fleetclean: warning: status --watch keeps {fits.kept.n} of {hosts} "
                        f"hosts' connections, all {fits.kept.by} leaves room for; the others "
                        "log in again at every refresh")
    return fits


def ask_become_pass(args: argparse.Namespace, jobs: list[fleet.Job]) -> list[fleet.Job]:
    """``-K``: asked once, after every input was checked and before any connection."""
    import dataclasses

    if not args.ask_become_pass:
        return jobs
    hosts = become.with_password([j.host for j in jobs], become.ask_password())
    return [dataclasses.replace(j, host=h) for j, h in zip(jobs, hosts, strict=True)]


def ssh_config_of(args: argparse.Namespace, env: Env) -> str | None:
    """-F, else $FLEETCLEAN_SSH_CONFIG, else None (~/.ssh/config); -F "" reads no
    ssh_config at all, like `ssh -F /dev/null`."""
    ssh_config: str | None = args.ssh_config
    if ssh_config is None:
        ssh_config = env.environ.get("FLEETCLEAN_SSH_CONFIG")
    return ssh_config


def login_runner(args: argparse.Namespace, env: Env, source: str) -> Runner:
    """Slurm's commands over SSH on the login node ``source`` (``slurm://LOGINHOST``)."""
    from fleetclean.slurm import login

    return login.runner(source, ssh_config_of(args, env), login_options(args))


def login_options(args: argparse.Namespace) -> Options:
    """Connection options for a Slurm login node: those of the command when it has them
    (``run``, ``status``), the defaults otherwise (``inventory``, ``show``)."""
    from fleetclean.transport import Options

    return Options(
        connect_timeout=getattr(args, "connect_timeout", None) or 10.0,
        timeout=min(getattr(args, "timeout", None) or 60.0, 60.0),
        known_hosts=tuple(getattr(args, "known_hosts", None) or ()),
        accept_new_host_keys=bool(getattr(args, "accept_new_host_keys", False)),
    )


def inventory_sources(args: argparse.Namespace, env: Env) -> list[str]:
    """Every -i, else $FLEETCLEAN_INVENTORY, else none."""
    if args.inventory:
        return list(args.inventory)
    default = env.environ.get("FLEETCLEAN_INVENTORY", "").strip()
    return [default] if default else []


def inventory_label(args: argparse.Namespace, env: Env) -> str | None:
    """The inventory as a run record names it."""
    return "--local" if args.local else " + ".join(inventory_sources(args, env)) or None


def options(args: argparse.Namespace) -> Options:
    from fleetclean.transport import Options

    if args.forks < 1:
        raise UsageError(f"--forks must be at least 1, not {args.forks}")
    timings = [("--connect-timeout", args.connect_timeout), ("--timeout", args.timeout)]
    watch = getattr(args, "watch", None)  # status alone has it
    if watch is not None:
        timings.append(("--watch", watch))
        machine = [flag for flag in ("json", "csv") if getattr(args, flag, None)]
        if machine:
            raise UsageError(f"--watch redraws a table, so --{machine[0]} cannot go with it",
                             hint=f"drop --watch for one --{machine[0]} result, or run it "
                                  "again to refresh")
    for flag, value in timings:
        if not math.isfinite(value) or value <= 0:  # nan and inf parse as floats
            raise UsageError(f"{flag} must be a positive number of seconds, not {value}",
                             hint=f"e.g. {flag} {2 if flag == '--watch' else 30}")
    return Options(
        connect_timeout=args.connect_timeout,
        timeout=args.timeout,
        known_hosts=tuple(args.known_hosts),
        accept_new_host_keys=args.accept_new_host_keys,
    )


_USER = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9._-]{0,31}\$?|[0-9]{1,10})$")


def scope_of(args: argparse.Namespace) -> Scope | None:
    """The scope --user and --gpus ask for, None for none; UsageError for a bad one."""
    from fleetclean.engine.model import Scope

    user = getattr(args, "user", None)
    gpus_text = getattr(args, "gpus", None)
    if user is None and gpus_text is None:
        return None
    if user is not None and not _USER.match(user):
        raise UsageError(f"--user {user!r} is not a user name or a UID",
                         hint="e.g. --user alice or --user 1000")
    return Scope(user=user, gpus=None if gpus_text is None else gpu_list(gpus_text))


# The highest GPU index --gpus takes: nodes have 8 or 16 GPUs; a typo's million-entry list
# rendered a script of hundreds of MB.
MAX_GPU_INDEX = 255


def gpu_list(text: str) -> tuple[int, ...]:
    """``--gpus 0,3`` or ``--gpus 2-5``: nvidia-smi's indexes, each once, ascending.

    >>> gpu_list("3,0,1-2")
    (0, 1, 2, 3)
    >>> gpu_list("gpu0")
    Traceback (most recent call last):
    fleetclean.errors.UsageError: --gpus 'gpu0': expected GPU indexes such as 0,3 or 2-5 (as nvidia-smi numbers them)
    """  # noqa: E501
    found: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        # ASCII digits: str.isdigit also takes "²", which int() refuses.
        if not re.fullmatch(r"[0-9]+", first) or (dash and not re.fullmatch(r"[0-9]+", last)) \
                or int(last or first) < int(first):
            raise UsageError(f"--gpus {text!r}: expected GPU indexes such as 0,3 or 2-5",
                             hint="as nvidia-smi numbers them")
        if int(last or first) > MAX_GPU_INDEX:
            raise UsageError(f"--gpus {text!r}: no node has a GPU {int(last or first)}",
                             hint=f"GPU indexes go from 0 to at most {MAX_GPU_INDEX}")
        found.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(found))


def render_jobs(
    playbook_ref: str, hosts: list[Host], extra: list[str], *, check: bool, force: bool,
    scope: Scope | None = None, last_clean: Collection[str] | None = None, run: str = "",
    unheard: Mapping[str, str] | None = None, named: Mapping[str, str] | None = None,
) -> tuple[str, list[fleet.Job], dict[str, Any]]:
    """Render every host's script before any connection: bad input never reaches a host.
    ``last_clean``: the hosts whose script parses the -q read's code only where the node
    asks for -q, and reads the query where the node's count cannot be read
    (render.Renderer.pieces); None: those :mod:`fleetclean.results.lastclean`
    knows clean. ``named``: each host's
    processes its last status named (PID:START words), which a status reads while its -q
    read runs; None: those
    lastclean keeps. ``run``: a teardown's token; ``unheard``: each host's tokens of
    teardowns whose end was not heard; None: those :mod:`fleetclean.results.unheard`
    keeps."""
    from fleetclean import fleet
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.render import Renderer
    from fleetclean.engine.variables import parse_extra_vars, resolve
    from fleetclean.results import lastclean
    from fleetclean.results import unheard as unheard_notes

    book = load_playbook(playbook_ref)
    extra_vars = parse_extra_vars(extra)
    become.refuse_password_vars(extra_vars)
    become.refuse_connection_vars(extra_vars)
    renderer = Renderer(scope)
    # Only a script whose first work is the GPU read (status) starts it by the hint.
    if book.stages or book.verify is None:
        clean: Collection[str] = ()
        seen: Mapping[str, str] = {}
    else:
        clean = lastclean.load() if last_clean is None else set(last_clean)
        seen = lastclean.named() if named is None else named
    asked = unheard_notes.load() if unheard is None else unheard
    jobs = []
    # Most hosts of a fleet share their variables (group_vars), and resolving them is most
    # of a post-extraction's rendering (0.24 ms a host): once per distinct set. repr keys
    # them exactly for what YAML and INI give (str, int, float, bool, None, lists, maps).
    resolved_for: dict[str, ResolvedPlaybook] = {}
    for host in hosts:
        key = repr(host.vars)
        resolved = resolved_for.get(key)
        if resolved is None:
            resolved = resolved_for[key] = resolve(book, host.vars, extra_vars, host.name)
        read_only = check or resolved.read_only
        # A read-only playbook's script keeps no journal: it carries no token. Only it reads
        # the processes named last time early: a teardown's verification reads the GPUs
        # after its signals.
        token = "" if read_only else run
        early = seen.get(host.name, "") if read_only and host.name not in clean else ""
        pieces = renderer.pieces(resolved, check=check, force=force, host_name=host.name,
                                 last_clean=host.name in clean, run=token,
                                 unheard=asked.get(host.name, ""), named=early)
        jobs.append(fleet.Job(host, pieces, token))
    return book.name, jobs, extra_vars
