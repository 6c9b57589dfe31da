"""``fleetclean export slurm-epilog|script PLAYBOOK``: print a script that runs without
fleetclean, for Slurm's ``Epilog=`` or for the fan-out tool a cluster already uses."""

from __future__ import annotations

import argparse
from typing import Any

from fleetclean.commands.env import Env, error_line
from fleetclean.commands.steps import scope_of, select_hosts
from fleetclean.errors import ExitStatus, VariableError

# pdsh passes the script as the remote command: one argument, which Linux caps at 128 KiB
# (MAX_ARG_STRLEN); past this (compressed: an inventory of many variants), copying the file
# to the nodes is the way.
PDSH_ARG_LIMIT = 120_000


def cmd_export(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
    text = _epilog(args) if args.what == "slurm-epilog" else _bundle(args, env)
    env.stdout.write(text)
    return int(ExitStatus.OK)


def _epilog(args: argparse.Namespace) -> str:
    from fleetclean.engine.export import DEFAULT_EPILOG_LOG, render_epilog
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.variables import parse_extra_vars, resolve

    book = load_playbook(args.playbook)
    extra = parse_extra_vars(args.extra_vars)
    log = epilog_log(extra.pop("epilog_log", DEFAULT_EPILOG_LOG))
    # slurmd runs the epilogs of a node's jobs at once, and one whose job left processes
    # holds the node's lock through its graces and verification: 5 s, then "host busy"
    # (exit 2), drained the node. An epilog waits its turn.
    if "lock_wait" not in book.vars:
        extra.setdefault("lock_wait", EPILOG_LOCK_WAIT)
    return render_epilog(resolve(book, {}, extra), log=log)


EPILOG_LOCK_WAIT = 600


def epilog_log(value: Any) -> str:
    """The epilog's log file: an absolute path on the node, one line of text.

    >>> epilog_log("/var/log/fleetclean/epilog.log")
    '/var/log/fleetclean/epilog.log'
    >>> epilog_log("epilog.log")
    Traceback (most recent call last):
    ...
    fleetclean.errors.VariableError: -e epilog_log='epilog.log': must be an absolute path on the node (e.g. /var/log/fleetclean/epilog.log)
    """  # noqa: E501
    text = value if isinstance(value, str) else ""
    if (not text.startswith("/") or text.endswith("/") or "/../" in f"{text}/"
            or any(ord(c) < 32 for c in text)):
        raise VariableError(f"-e epilog_log={value!r}: must be an absolute path on the node",
                            hint="e.g. /var/log/fleetclean/epilog.log")
    return text


def _bundle(args: argparse.Namespace, env: Env) -> str:
    from fleetclean.engine.export import armored, bundle_title, compressed, render_bundle
    from fleetclean.engine.playbook import load_playbook
    from fleetclean.engine.variables import parse_extra_vars, resolve
    from fleetclean.transport import boot

    hosts = select_hosts(args, env, warn=True)
    book = load_playbook(args.playbook)
    extra = parse_extra_vars(args.extra_vars)
    books = [(h.name, resolve(book, h.vars, extra)) for h in hosts]
    text = render_bundle(books, playbook=book.name, check=args.check, force=args.force,
                         scope=scope_of(args))
    if args.plain:
        return text
    if not args.pdsh:
        # For `clush 'bash -s'`, whose start a login shell's startup file may take.
        return armored(text, title=bundle_title(book.name, [h.name for h in hosts]))
    # pdsh hands the bundle over as one argument (128 KiB at most: compressed), and
    # expands %h, %u, %n and %% in it (the exec and ssh modules alike), which turned the
    # bundle's ${line%%,*} into ${line%,*}: in base64 it holds no %, and any in the words
    # around it are doubled.
    text = boot.given(compressed(text)).replace("%", "%%")
    if len(text.encode()) > PDSH_ARG_LIMIT:
        error_line(env, f"fleetclean: warning: the bundle is {len(text.encode()) // 1024} KiB, "
                   "too long to pass as pdsh's command; copy it to the nodes (pdcp, clush "
                   "--copy) and run 'bash FILE' there")
    return text
