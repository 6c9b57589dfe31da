"""The CLI's contract for bad options: one line, exit 4, no traceback."""

import argparse
import io

import pytest

from fleetclean import __version__
from fleetclean.cli import Env, main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"}))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run"], "the following arguments are required: PLAYBOOK"),
        (["run", "post-extraction"], "no inventory given (give -i lab.yml or -i 'gpu01,gpu02,'"),
        (["status", "--local", "-i", "x.yml"], "--local is this machine alone"),
        (["status", "-c", "telnet", "-i", "x.yml"], "invalid choice: 'telnet'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["status", "-i", "x.yml", "--forks", "many"], "invalid int value: 'many'"),
        (["run", "post-extraction", "-i", "x.yml", "--json", "--csv"], "not allowed with"),
        (["status", "-i", "127.203.0.1,", "--watch", "inf"], "--watch must be a positive"),
        (["status", "-i", "127.203.0.1,", "--watch", "0"], "--watch must be a positive"),
        (["status", "-i", "127.203.0.1,", "--watch", "2", "--json"], "--json cannot go with"),
        # An empty limit (a script's empty list of hosts to retry) is not "every host".
        (["run", "post-extraction", "-i", "127.203.0.1,", "-l", ","], "holds no host pattern"),
        (["run", "post-extraction", "-i", "127.203.0.1,", "-l", "all:!"], "no pattern after"),
        # Ansible's -e beats the inventory; fleetclean's would have been silently unused.
        (["run", "post-extraction", "-i", "127.203.0.1,", "-e", "ansible_user=admin"],
         "-e ansible_user: a connection variable is read from the inventory"),
    ],
)
def test_bad_options_get_one_line_and_exit_4(argv: list[str], needle: str) -> None:
    code, out, err = run(*argv)
    assert code == 4
    assert out == ""
    assert err.count("\n") == 1 and needle in err
    assert "Traceback" not in err


def test_version() -> None:
    with pytest.raises(SystemExit) as exc:
        run("--version")
    assert exc.value.code == 0


def test_help_lists_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run()
    assert code == 0
    assert "fleetclean run post-extraction -i lab.yml" in out
    assert __version__


@pytest.mark.parametrize("var", ["server_pattern", "worker_pattern"])
def test_an_empty_pattern_is_refused_because_it_would_match_every_process(var: str) -> None:
    code, out, err = run("show", "post-extraction", "-e", f"{var}=")
    assert code == 4
    assert out == ""
    assert "is empty, so it would match every process" in err


@pytest.mark.parametrize("pattern", [".+", "s", "[a-z]", ".*x*"])
def test_a_catch_all_pattern_is_refused_before_anything_is_sent(pattern: str) -> None:
    code, out, err = run("show", "post-extraction", "-e", f"server_pattern={pattern}")
    assert code == 4
    assert out == ""
    assert "would match ordinary processes" in err or "matches the empty string" in err


@pytest.mark.parametrize("pattern", ["sglang", "python3", "bash|sshd", "train_worker"])
def test_specific_patterns_are_accepted(pattern: str) -> None:
    code, out, _ = run("show", "post-extraction", "-e", f"server_pattern={pattern}")
    assert code == 0 and out.startswith("#!/usr/bin/env bash")


def test_a_run_whose_controller_died_shows_as_incomplete_in_history(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetclean.results.records import RunRecord

    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path))
    record = RunRecord.start(playbook="post-extraction", hosts=["gpu01", "gpu02"],
                             argv=["run", "post-extraction"], inventory="lab.yml",
                             variables={"grace": "5"}, check=False)
    code, out, _ = run("history")
    assert code == 0
    assert "post-extraction" in out and "2 hosts  INCOMPLETE" in out
    code, out, _ = run("history", record.data["id"])
    assert "what ran on gpu01, gpu02 is unknown" in " ".join(out.split())


def test_history_with_a_bad_reference_is_one_line_not_a_traceback(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "20260101T000000-1-x.json").write_text("{not json")
    for ref in ("-5", "-1", "nope"):
        code, out, err = run("history", ref)
        assert code == 4 and out == "" and err.count("\n") == 1, (ref, err)
    code, out, _ = run("history")
    assert code == 0


def test_every_commands_help_has_examples() -> None:
    from fleetclean.commands.parser import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [name for name, parser in sub.choices.items()
               if name != "__complete" and "examples:" not in (parser.epilog or "")
               and "install:" not in (parser.epilog or "")]
    assert not missing, f"--help without examples: {missing}"


def test_an_error_line_writes_no_control_character_raw() -> None:
    # A login node's error or a certificate's words reach this line: an escape sequence
    # in them cleared the terminal of whoever ran fleetclean.
    from fleetclean.commands.env import error_line

    err = io.StringIO()
    error_line(Env(stdout=io.StringIO(), stderr=err), "fleetclean: x \x1b[2J\x1b]0;pwned\x07 y")
    assert err.getvalue() == "fleetclean: x \\x1b[2J\\x1b]0;pwned\\x07 y\n"
