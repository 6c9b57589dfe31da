"""sudo's dialogue, pure: its answers as Debian's sudo 1.9.13 wrote them (captured on the
simulated nodes with LC_ALL=C) -> the next step or the failure a person reads; and the
local runner driving a stand-in sudo through a real pipe."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fleetclean.models import Host, Secret
from fleetclean.transport import Options, Session
from fleetclean.transport.become import Dialog, plan
from fleetclean.transport.boot import BASH

P = "[fleetclean-sudo:abc]"
ALICE = Host("gpu07", "10.0.0.7", user="alice", become=True, become_password=Secret("pw"))


def dialog(host: Host = ALICE) -> Dialog:
    return Dialog(host, plan(host, "abc"))


def test_the_password_is_sent_once_on_the_first_prompt_and_a_second_prompt_fails() -> None:
    d = dialog()
    assert d.step("").kind == "wait"
    assert d.step(P).kind == "send"
    assert d.step(P).kind == "wait", "answered: waiting for sudo's verdict"
    step = d.step(f"{P}Sorry, try again.\n{P}")
    assert step.kind == "fail" and step.failure is not None
    assert step.failure.kind == "auth_failed"


def test_the_ready_line_starts_the_script_with_or_without_a_prompt() -> None:
    assert dialog().step("@@fleetclean-become:abc\n").kind == "ready"  # NOPASSWD, cached
    d = dialog()
    d.step(P)
    assert d.step(f"{P}@@fleetclean-become:abc\n").kind == "ready"


def test_no_password_means_sudo_n_and_never_a_prompt() -> None:
    host = Host("gpu07", "10.0.0.7", user="alice", become=True, become_user="gpuadmin")
    p = plan(host, "abc")
    assert p.command.startswith(f"env LC_ALL=C sudo -n -u gpuadmin -- {BASH} -c ")
    assert p.password is None and P not in p.command


@pytest.mark.parametrize(("said", "exit_code", "kind", "words"), [
    ("sudo: a password is required\n", 1, "auth_failed", "asks alice for a password"),
    (f"{P}Sorry, try again.\n{P}\nsudo: no password was provided\n"
     "sudo: 1 incorrect password attempt\n", 1, "auth_failed", "refused the become password"),
    (f"{P}alice is not in the sudoers file.\n", 1, "error",
     "alice may not run commands as root with sudo on gpu07 (alice is not in the sudoers "
     "file.)"),
    ("Sorry, user alice may not run sudo on gpu07.\n", 1, "error", "(Sorry, user alice may "
     "not run sudo on gpu07.)"),
    ("sudo: sorry, you must have a tty to run sudo\n", 1, "error", "Defaults requiretty"),
    ("sudo: unknown user gpuadmin\nsudo: error initializing audit plugin sudoers_audit\n", 1,
     "error", "there is no user"),
    ("env: 'sudo': No such file or directory\n", 127, "error", "sudo is not installed on gpu07"),
    ("sudo: PAM account management error: Authentication service cannot retrieve user "
     "credentials\n", 1, "error", "did not start the script (exit 1): PAM account"),
])
def test_each_answer_of_sudo_is_one_failure_line(
    said: str, exit_code: int, kind: str, words: str
) -> None:
    failure = dialog().ended(said, exit_code)
    assert failure.kind == kind
    assert words in failure.message
    assert "\n" not in failure.message and P not in failure.message


def test_a_prompt_fleetclean_does_not_know_times_out_naming_it() -> None:
    failure = dialog().timed_out("10.0.0.7:22", 5, "Password (OTP): ")
    assert (failure.kind, failure.message) == (
        "timeout",
        "10.0.0.7:22: sudo did not start the script within 5s (sudo said: Password (OTP):)")


FAKE_SUDO = """#!/bin/bash
# A stand-in for sudo -S -p PROMPT / -n: asks (or not) like sudo, then runs the command.
prompt=""
while [[ $1 != -- ]]; do
    case $1 in -p) prompt=$2; shift ;; -n) prompt="" ;; esac
    shift
done
shift
if [[ -n $prompt ]]; then
    printf '%s' "$prompt" >&2
    IFS= read -r answer
    if [[ $answer != right ]]; then
        printf 'Sorry, try again.\\n%s' "$prompt" >&2
        IFS= read -r answer
        echo "sudo: 1 incorrect password attempt" >&2
        exit 1
    fi
fi
exec "$@"
"""


@pytest.fixture
def fake_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sudo = tmp_path / "sudo"
    sudo.write_text(FAKE_SUDO)
    sudo.chmod(sudo.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(("password", "ok"), [("right", True), ("wrong", False)])
def test_local_become_answers_the_prompt_then_sends_the_script(
    fake_sudo: None, password: str, ok: bool
) -> None:
    host = Host("here", "localhost", connection="local", user="me", become=True,
                become_password=Secret(password))
    with Session(Options(connect_timeout=5, timeout=10)) as session:
        out = session.run(host, "echo ran; read -r x || echo stdin-empty\n")
    if ok:
        assert out.ok and out.stdout == "ran\nstdin-empty\n", out
        assert out.stderr == "", "sudo's prompt and the ready line are not the script's"
    else:
        assert out.failure is not None and out.failure.kind == "auth_failed"
        assert not out.started and out.stdout == ""
