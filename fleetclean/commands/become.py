"""``-b/--become``, ``--become-user``, ``--become-method`` and ``-K/--ask-become-pass``, as
Ansible has them, for ``run`` and ``status``.

As in Ansible, the command line gives defaults: an inventory's own ``ansible_become``,
``ansible_become_user`` or ``ansible_become_password`` wins over ``-b``, ``--become-user``
and ``-K`` for the hosts it covers. ``-K`` asks once, on the terminal (never on stdin, which
may be a pipe), before any connection; the password is then held as a
:class:`~fleetclean.models.Secret` and goes nowhere but to sudo's standard input when sudo
asks for it (``fleetclean.transport.become``). It is never accepted on the command line.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_options(p)
>>> defaults(p.parse_args(["-b", "--become-user", "gpuadmin"]))
{'ansible_become': True, 'ansible_become_user': 'gpuadmin'}
>>> refuse_password_vars({"ansible_become_password": "x"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
fleetclean.errors.VariableError: -e ansible_become_password: a password on the command line...
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetclean.errors import UsageError, VariableError

if TYPE_CHECKING:  # the parser imports this module: every start-up, kept light
    from fleetclean.models import Host, Secret

PROMPT = "BECOME password: "  # Ansible's words
PASSWORD_VARS = ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass",
                 "ansible_password", "ansible_ssh_pass")


def add_options(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("privilege escalation (as in Ansible; the inventory's "
                              "ansible_become* win over these)")
    g.add_argument("-b", "--become", action="store_true",
                   help="run the script as root (or --become-user) through sudo")
    g.add_argument("--become-user", metavar="USER", help="the user to become (default root)")
    g.add_argument("--become-method", choices=("sudo",), help="how to become it: sudo only")
    g.add_argument("-K", "--ask-become-pass", action="store_true",
                   help="ask sudo's password once, on this terminal")


def defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's become settings as the inventory's variables they default."""
    out: dict[str, Any] = {}
    if getattr(args, "become", False):
        out["ansible_become"] = True
    user = getattr(args, "become_user", None)
    if user is not None:
        if not user.strip():
            raise UsageError("--become-user is empty", hint="e.g. --become-user root")
        out["ansible_become_user"] = user
    if getattr(args, "become_method", None):
        out["ansible_become_method"] = args.become_method
    return out


def ask_password() -> Secret:
    """sudo's password, asked on the controlling terminal; UsageError when there is none
    (a cron job, CI, ``ssh host fleetclean ...``): a pipe on stdin is never read for it."""
    import getpass

    from fleetclean.models import Secret

    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        raise UsageError(
            "-K/--ask-become-pass needs a terminal to ask on, and there is none",
            hint="run it from a terminal, or set ansible_become_password in an inventory "
            "only you can read",
        ) from None
    os.close(fd)
    try:
        # getpass reads /dev/tty itself, with echo off, and writes the prompt there.
        text = getpass.getpass(PROMPT)
    except EOFError:
        raise UsageError("no become password given (end of input at the prompt)") from None
    if any(c in text for c in "\r\n\0"):
        raise UsageError("the become password holds a line break; sudo reads one line")
    return Secret(text)


def with_password(hosts: list[Host], secret: Secret) -> list[Host]:
    """``-K``'s password for every host whose inventory gives none."""
    import dataclasses

    return [h if h.become_password is not None else dataclasses.replace(h, become_password=secret)
            for h in hosts]


def refuse_password_vars(extra: Mapping[str, Any]) -> None:
    """A password given with ``-e`` would sit in the process list, the shell's history and
    the run record: refused, with where to put it instead."""
    for name in PASSWORD_VARS:
        if name in extra:
            raise VariableError(
                f"-e {name}: a password on the command line is visible to every user of "
                "this machine and kept in the run record",
                hint="use -K/--ask-become-pass, or ansible_become_password in an inventory "
                "only you can read",
            )


def refuse_connection_vars(extra: Mapping[str, Any]) -> None:
    """``-e ansible_user=...`` (host, port, key, ...): Ansible's ``-e`` beats every other
    setting, fleetclean takes connection variables from the inventory alone, so such a
    value was silently not used (a run as the wrong user, on the wrong port): refused."""
    for name in extra:
        if name.startswith("ansible_") and name not in PASSWORD_VARS:
            raise VariableError(
                f"-e {name}: a connection variable is read from the inventory, not from -e "
                "(it would not be used)",
                hint="set it in the inventory, on the hosts or under all: vars:; "
                "-b/--become-user for sudo",
            )
