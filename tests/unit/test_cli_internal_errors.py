"""A bug in fleetclean: one line naming it and exit 3, or its traceback with --debug."""

from __future__ import annotations

import argparse
import io

import pytest

from fleetclean.cli import Env, main
from fleetclean.commands import info
from fleetclean.errors import ExitStatus


def run(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Env(stdout=out, stderr=err, environ=environ or {}))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def broken_playbooks(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: argparse.Namespace, env: Env, argv: list[str]) -> int:
        raise ZeroDivisionError("division by zero in the playbook list")

    monkeypatch.setattr(info, "cmd_playbooks", boom)


def test_an_unexpected_exception_is_one_line_naming_the_bug_and_exit_3(
    broken_playbooks: None,
) -> None:
    code, out, err = run("playbooks")
    assert code == ExitStatus.INTERNAL == 3
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "internal error" in err
    assert "ZeroDivisionError: division by zero in the playbook list" in err
    assert "test_cli_internal_errors.py" in err and "in boom" in err  # where it was raised
    assert "--debug" in err


@pytest.mark.parametrize("argv,environ", [
    (["--debug", "playbooks"], {}),
    (["playbooks", "--debug"], {}),
    (["playbooks"], {"FLEETCLEAN_DEBUG": "1"}),
])
def test_debug_prints_the_traceback(
    broken_playbooks: None, argv: list[str], environ: dict[str, str]
) -> None:
    code, _, err = run(*argv, environ=environ)
    assert code == 3
    assert err.startswith("Traceback (most recent call last):")
    assert "raise ZeroDivisionError" in err
    assert err.rstrip().endswith("ZeroDivisionError: division by zero in the playbook list")


def test_fleetclean_debug_0_means_off(broken_playbooks: None) -> None:
    code, _, err = run("playbooks", environ={"FLEETCLEAN_DEBUG": "0"})
    assert code == 3 and "Traceback" not in err


def test_bad_input_stays_exit_4_with_debug() -> None:
    code, _, err = run("--debug", "run")
    assert code == 4 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["status", "--help"]])
def test_exit_status_3_is_in_the_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(*argv)
    assert "3 internal error (a bug" in " ".join(capsys.readouterr().out.split())
