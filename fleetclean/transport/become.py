"""Become root (or ``ansible_become_user``) through sudo before the script starts.

With become, the one command run on the host is::

    env LC_ALL=C sudo -S -p '[fleetclean-sudo:NONCE]' -u root -- \\
        bash --norc -p -c 'echo @@fleetclean-become:NONCE >&2; exec bash --norc -p -s'

(``-n`` instead of ``-S -p ...`` when no password was given: sudo then fails at once
instead of waiting for one). Nothing of the script is sent until that ``bash -c`` runs
as the target user and says so on stderr; the script then follows on stdin to ``bash -s``,
as without become, so no pattern of it is ever in a process's argv.

The password goes only to sudo's standard input, and only in answer to the prompt
fleetclean chose (``-p``), which sudo prints on stderr where nobody sees it. Sent blind, it
would reach the shell as a command line whenever sudo does not ask (NOPASSWD, a cached
timestamp). A second prompt means the password was refused; whatever else sudo says
before the ready line (no sudo rights, ``requiretty``, an unknown user) becomes one failure
a person can act on, and nothing has run. The whole dialogue gets the connect timeout.
``LC_ALL=C`` keeps sudo's own messages in English, which is how they are told apart.

>>> host = Host("gpu01", "10.0.0.1", user="alice", become=True, become_password=Secret("pw"))
>>> p = plan(host, "n0nce")
>>> p.command  # doctest: +NORMALIZE_WHITESPACE
"env LC_ALL=C sudo -S -p '[fleetclean-sudo:n0nce]' -u root --
 bash --norc -p -c 'echo @@fleetclean-become:n0nce >&2; exec bash --norc -p -s'"
>>> d = Dialog(host, p)
>>> d.step("").kind, d.step("[fleetclean-sudo:n0nce]").kind
('wait', 'send')
>>> d.step("[fleetclean-sudo:n0nce]Sorry, try again.\\n[fleetclean-sudo:n0nce]").failure
... # doctest: +NORMALIZE_WHITESPACE
TransportFailure(kind='auth_failed', message='sudo on gpu01 refused the become password
 for alice; check the password given with -K/--ask-become-pass or ansible_become_password')
>>> d.ended("[fleetclean-sudo:n0nce]alice is not in the sudoers file.\\n", 1).kind
'error'
>>> plan(Host("h", "h")).command
'bash --norc -p -s'
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Protocol

from fleetclean.models import Host, Secret
from fleetclean.transport.base import TransportFailure
from fleetclean.transport.boot import BASH

__all__ = ["Dialog", "Pipe", "Plan", "Step", "converse", "plan"]

PROMPT = "[fleetclean-sudo:{nonce}]"
READY = "@@fleetclean-become:{nonce}"


@dataclass(frozen=True)
class Plan:
    """The command that starts the script, and for become, what sudo's dialogue looks for."""

    command: str
    prompt: str = ""
    ready: str = ""
    password: Secret | None = None

    @property
    def becomes(self) -> bool:
        return bool(self.ready)


def plan(host: Host, nonce: str | None = None, start: str = f"{BASH} -s") -> Plan:
    """How the script starts on ``host``: ``start`` without become (over SSH, ``boot``'s
    command); ``nonce`` (random by default) makes the prompt and the ready line ones no
    other program prints. With become nothing is sent before sudo's bash says it is
    ready, so no startup file of the login shell can read any of the script: ``bash -s``."""
    if not host.become:
        return Plan(start)
    if not nonce:
        import secrets  # hmac and OpenSSL's hashes: only a run through sudo needs them

        nonce = secrets.token_hex(6)
    prompt, ready = PROMPT.format(nonce=nonce), READY.format(nonce=nonce)
    # -p takes %-escapes (%u, %h); the prompt has no '%', so sudo prints it as it is.
    how = f"-S -p {shlex.quote(prompt)}" if host.become_password else "-n"
    user = shlex.quote(host.become_user or "root")
    inner = shlex.quote(f"echo {ready} >&2; exec {BASH} -s")
    command = f"env LC_ALL=C sudo {how} -u {user} -- {BASH} -c {inner}"
    return Plan(command, prompt, ready, host.become_password)


@dataclass(frozen=True)
class Step:
    """What to do next: ``wait``, ``send`` the password, ``ready`` (send the script), or
    ``fail`` with ``failure``."""

    kind: str
    failure: TransportFailure | None = None


class Dialog:
    """sudo's stderr so far -> the next step. Pure: the drivers (``converse``) do the I/O."""

    def __init__(self, host: Host, p: Plan) -> None:
        self.host = host
        self.plan = p
        self.answered = 0

    @property
    def login(self) -> str:
        return self.host.user or "the login user"

    @property
    def target(self) -> str:
        return self.host.become_user or "root"

    def step(self, err: str) -> Step:
        if self.plan.ready + "\n" in err:
            return Step("ready")
        asked = err.count(self.plan.prompt) if self.plan.prompt else 0
        if asked > self.answered:
            if self.answered == 0:
                self.answered = 1
                return Step("send")
            # Asked again: sudo said "Sorry, try again." (in any language).
            return Step("fail", self.refused())
        return Step("wait")

    def refused(self) -> TransportFailure:
        return TransportFailure(
            "auth_failed",
            f"sudo on {self.host.name} refused the become password for {self.login}; "
            "check the password given with -K/--ask-become-pass or ansible_become_password")

    def said(self, err: str) -> str:
        """sudo's last words, without fleetclean's prompts, sudo's ``sudo:`` prefix and the
        audit plugin's complaint that follows some of them."""
        lines = [line.strip() for line in err.replace(self.plan.prompt, "\n").splitlines()]
        words = [line.removeprefix("sudo: ") for line in lines if line]
        meant = [w for w in words if "audit plugin" not in w]
        return meant[-1] if meant else ""

    def ended(self, err: str, exit_code: int | None) -> TransportFailure:
        """sudo exited (or the session closed) without starting the script."""
        said = self.said(err)
        name, login, target = self.host.name, self.login, self.target
        if "a password is required" in err:
            return TransportFailure(
                "auth_failed",
                f"sudo on {name} asks {login} for a password (before it checks what {login} "
                "may run) and none was given; rerun with "
                f"-K (--ask-become-pass), set ansible_become_password, or give {login} "
                "NOPASSWD in sudoers")
        if "incorrect password attempt" in err:
            return self.refused()
        if any(s in err for s in ("not in the sudoers file", "may not run sudo",
                                  "is not allowed to execute")):
            return TransportFailure(
                "error",
                f"{login} may not run commands as {target} with sudo on {name} ({said}); ask "
                f"its admin for a sudoers rule, or run without become: fleetclean then "
                f"signals only {login}'s own processes")
        if "must have a tty" in err:
            return TransportFailure(
                "error",
                f"sudo on {name} requires a terminal (Defaults requiretty) and fleetclean "
                f"never runs the script in one; ask its admin for 'Defaults:{login} "
                "!requiretty', or log in as root without become")
        if "unknown user" in err:
            return TransportFailure(
                "error", f"sudo on {name}: there is no user '{target}' (ansible_become_user "
                "or --become-user)")
        if exit_code == 127 or "sudo: command not found" in err or "sudo: not found" in err:
            return TransportFailure(
                "error", f"sudo is not installed on {name} ({said or 'exit 127'}); install it, "
                "or log in as root without become")
        code = "no exit status" if exit_code is None else f"exit {exit_code}"
        return TransportFailure(
            "error", f"sudo on {name} did not start the script ({code}): {said or 'no output'}")

    def timed_out(self, where: str, limit: float, err: str) -> TransportFailure:
        said = self.said(err)
        return TransportFailure(
            "timeout", f"{where}: sudo did not start the script within {limit:g}s"
            + (f" (sudo said: {said})" if said else " (is it asking with a prompt of its own?)"))


class Pipe(Protocol):
    """The started command as the dialogue sees it (an SSH channel, a local process)."""

    @property
    def stderr(self) -> str: ...

    def wait(self, timeout: float) -> None:
        """Until output may have arrived, at most ``timeout`` seconds."""

    def drain(self) -> None:
        """Read what arrived; stderr is kept, stdout dropped (no script has run yet)."""

    def send(self, data: bytes) -> None: ...

    def ended(self) -> bool: ...

    def exit_code(self) -> int | None: ...


def converse(pipe: Pipe, host: Host, p: Plan, where: str, limit: float) -> TransportFailure | None:
    """Take sudo through its dialogue; None once the script may be sent."""
    dialog = Dialog(host, p)
    deadline = time.monotonic() + limit
    while True:
        pipe.drain()
        step = dialog.step(pipe.stderr)
        if step.kind == "ready":
            return None
        if step.kind == "fail":
            return step.failure
        if step.kind == "send":
            assert p.password is not None
            pipe.send(p.password.reveal().encode() + b"\n")
            continue
        if pipe.ended():
            pipe.drain()
            if dialog.step(pipe.stderr).kind == "ready":
                return None
            return dialog.ended(pipe.stderr, pipe.exit_code())
        left = deadline - time.monotonic()
        if left <= 0:
            return dialog.timed_out(where, limit, pipe.stderr)
        pipe.wait(min(left, 1.0))
