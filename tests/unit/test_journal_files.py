"""The node's journal files (``lib.sh``: the journal), worked on by lib.sh's own functions
in a directory of the test's: which heard journals a controller's tokens get told, which
the node answers for, and which it keeps. No simulator: nothing here runs a teardown."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.stages import template
from fleetclean.results.parse import parse_script_output


def lib(script: str, cwd: Path) -> str:
    """``script`` run by bash after lib.sh's definitions; its records."""
    return subprocess.run(["bash", "-c", template("lib.sh") + "\n" + script + "\nfc_flush\n"],
                          cwd=cwd, capture_output=True, text=True, check=True, timeout=30).stdout


def journal(token: str, *records: str) -> str:
    rec = "@@fleetclean\t{}\n".format
    return rec(f"journaled\t1700000000\t{token}") + "".join(rec(r) for r in records)


@pytest.fixture
def d(tmp_path: Path) -> Path:
    """The node's lock directory, where its journals are."""
    path = tmp_path / "lock"
    path.mkdir()
    return path


def test_each_token_asked_for_is_told_and_answered_unless_its_run_is_at_work(
    d: Path, tmp_path: Path
) -> None:
    (d / "heard.aaa").write_text(journal("aaa", "begin\t1\tpost-extraction\tgpu01\t0",
                                         "done\t0"))
    # bbb's run is at work: its journal not renamed yet, though a heard.bbb (a rename that
    # came between two reads) is there too.
    (d / "journal").write_text(journal("bbb", "begin\t1\tpost-extraction\tgpu01\t0"))
    (d / "heard.bbb").write_text(journal("bbb", "done\t0"))
    out = lib(f"FC_UNHEARD='aaa bbb ccc'\nfc_journal_asked {d} 0", tmp_path)
    report = parse_script_output(out, "", 0)
    (said,) = report.warnings
    assert said.startswith("the post-extraction run begun here at ") and \
        "went on unheard by its controller" in said, said
    assert report.answered == ("aaa", "ccc")  # bbb's run still at work: not yet
    # Kept: told again until the controller has the answer (and forgets the token).
    assert "done" in (d / "heard.aaa").read_text()


def test_a_node_with_no_journal_directory_answers_that_it_keeps_nothing(
    tmp_path: Path,
) -> None:
    # A node that rebooted (/run emptied): no lock directory of this login anywhere.
    out = lib("fc_lock_dir() { return 1; }\nFC_UNHEARD='aaa bbb'\nfc_journal_look", tmp_path)
    report = parse_script_output(out, "", 0)
    assert report.answered == ("aaa", "bbb") and report.warnings == ()


def test_a_teardown_tells_the_journal_of_an_asked_run_that_ended_without_its_exit(
    d: Path, tmp_path: Path
) -> None:
    (d / "journal").write_text(journal("bbb", "begin\t1\tpost-extraction\tgpu01\t0",
                                       "stage\t1\tstop-server\tsignal"))
    out = lib(f"FC_UNHEARD=bbb\nfc_journal_asked {d} 1", tmp_path)
    report = parse_script_output(out, "", 0)
    (said,) = report.warnings
    assert said.endswith("it stopped before its end (killed, or the node went down)"), said
    assert report.answered == ("bbb",)


def test_a_node_keeps_the_64_newest_heard_journals(d: Path, tmp_path: Path) -> None:
    for i in range(66):
        f = d / f"heard.t{i}"
        f.write_text(journal(f"t{i}", "done\t0"))
        os.utime(f, (1700000000 + (i * 7919) % 66, 1700000000 + (i * 7919) % 66))
    lib(f"fc_journal_prune {d}", tmp_path)
    ages = sorted(int(f.stat().st_mtime) - 1700000000 for f in d.iterdir())
    assert ages == list(range(2, 66))  # the two oldest went
    lib(f"fc_journal_prune {d}", tmp_path)  # 64: none goes
    assert len(list(d.iterdir())) == 64
