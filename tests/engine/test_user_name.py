"""A process's user, named as ``ps`` would (lib.sh: ``fc_user_name``): /etc/passwd first,
searched for the UIDs asked alone, then the directory service (getent, under a timeout),
then the number. Each case is one ``bash`` with the packaged lib.sh loaded, a passwd file
of the test's own and a getent of its own on PATH that logs each question."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetclean.engine.stages import template


@pytest.fixture
def passwd(tmp_path: Path) -> Path:
    """5,000 accounts; UID 4242 twice (the first line's name is the one), and before
    both a line whose group, not its user, is 4242; last, NIS's compat line, which has no
    UID (an empty array key: the loop before this search ended the whole script there)."""
    lines = ["root:x:0:0:root:/root:/bin/bash",
             "eve:x:5000:4242::/home/eve:/bin/bash",
             "alice:x:4242:4242::/home/alice:/bin/bash"]
    lines += [f"u{i}:x:{10000 + i}:{10000 + i}::/home/u{i}:/bin/bash" for i in range(5000)]
    lines += ["bob:x:4242:100::/home/bob:/bin/bash", "+::::::"]
    path = tmp_path / "passwd"
    path.write_text("\n".join(lines) + "\n")
    return path


def names(tmp_path: Path, passwd: Path, uids: str, getent: str = 'exit 2') -> tuple[
        list[str], list[str]]:
    """Each UID's name, and the UIDs getent was asked."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    log = tmp_path / "asked"
    log.write_text("")
    stub = bindir / "getent"
    stub.write_text(f'#!/bin/sh\necho "$3" >>{log}\n{getent}\n')
    stub.chmod(0o755)
    script = "\n".join([template("lib.sh"), f"FC_PASSWD_FILE={passwd}",
                        f'for u in {uids}; do fc_user_name "$u"; echo "$u=$REPLY"; done'])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bindir}:/usr/bin:/bin"}, check=True)
    return out.stdout.split(), log.read_text().split()


def test_names_come_from_the_first_line_of_their_uid(tmp_path: Path, passwd: Path) -> None:
    got, asked = names(tmp_path, passwd, "4242 0 14999 10000 4242")
    assert got == ["4242=alice", "0=root", "14999=u4999", "10000=u0", "4242=alice"]
    assert asked == []  # every one was in the file: no directory asked


def test_from_the_fourth_uid_on_the_file_is_read_whole_with_the_same_names(
    tmp_path: Path, passwd: Path,
) -> None:
    # 4242 and 5000 come fourth and fifth: read from the whole table, first lines winning
    # as in the search; a UID the table lacks then goes to the directory.
    got, asked = names(tmp_path, passwd, "0 10000 14999 4242 5000 7000 10001")
    assert got == ["0=root", "10000=u0", "14999=u4999", "4242=alice", "5000=eve",
                   "7000=7000", "10001=u1"]
    assert asked == ["7000"]


def test_a_uid_the_file_lacks_is_asked_of_the_directory_once(
    tmp_path: Path, passwd: Path,
) -> None:
    got, asked = names(tmp_path, passwd, "7000 7000 7001",
                       getent='[ "$3" = 7000 ] && echo "carol:*:7000:7000::/home/carol:/bin/sh"'
                              ' || exit 2')
    assert got == ["7000=carol", "7000=carol", "7001=7001"]
    assert asked == ["7000", "7001"]


def test_a_directory_that_does_not_answer_is_asked_once_a_run(
    tmp_path: Path, passwd: Path,
) -> None:
    got, asked = names(tmp_path, passwd, "7000 7001 4242", getent="sleep 10")
    assert got == ["7000=7000", "7001=7001", "4242=alice"]
    assert asked == ["7000"]  # its 2 s spent once; the file still answers


def test_a_missing_file_or_no_uid_gives_the_number_or_a_dash(tmp_path: Path) -> None:
    got, asked = names(tmp_path, tmp_path / "none", "0 - x")
    assert got == ["0=0", "-=-", "x=x"]
    assert asked == ["0"]


@pytest.mark.parametrize("asked", ["20 30", "1 2 3 20 30"], ids=["searched", "table"])
def test_both_ways_agree_on_a_nameless_line_and_a_last_line_without_newline(
    tmp_path: Path, asked: str,
) -> None:
    path = tmp_path / "passwd"
    path.write_text("::20:20::/:/bin/sh\ncarol:x:20:20::/:/bin/sh\n"
                    "daemon:x:1:1::/:/bin/sh\nbin:x:2:2::/:/bin/sh\nsys:x:3:3::/:/bin/sh\n"
                    "last:x:30:30::/:/bin/sh")
    got, asked_of_directory = names(tmp_path, path, asked)
    assert got[-2:] == ["20=carol", "30=last"]
    assert asked_of_directory == []
