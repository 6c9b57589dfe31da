"""The notes of nvidia-smi calls left in a hung driver (lib.sh: fc_smi_note, fc_smi_noted),
worked on by lib.sh's own functions in directories of the test's: a run starts no
nvidia-smi while a note names one still waiting there, and reads only the notes no other
login could have planted. Whether a process waits in the driver (state D, comm nvidia-smi)
is stood in for (``fc_smi_in_driver``): the end-to-end tests (test_e2e_hung_smi.py) have
the simulator's real wait in the kernel.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetclean.engine.stages import template

# PID 4242 waits in the driver, started at 777; nothing else does.
STUB = 'fc_smi_in_driver() { FC_F=(); FC_F[19]=777; [[ $1 == 4242 ]]; }\n'
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs bash as root and as nobody")


def noted(script: str, as_user: int | None = None) -> str:
    """FC_SMI_HUNG after ``script`` and fc_smi_noted, in bash after lib.sh (as the user
    ``as_user``, or as root)."""
    argv = ["bash", "-c", template("lib.sh") + "\n" + STUB + script
            + '\nfc_smi_noted\nprintf "%s" "$FC_SMI_HUNG"\n']
    if as_user is not None:
        argv = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups",
                *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30,
                          cwd="/").stdout


def test_root_reads_its_own_note_and_only_that(tmp_path: Path) -> None:
    run, planted = tmp_path / "run-note", tmp_path / "tmp-note"
    notes = f"FC_SMI_NOTES=({run} {planted} /-/x)\n"
    # Written by fc_smi_note, whole, where fc_smi_noted reads it.
    said = noted(notes + "fc_smi_note $'4242 777\\n'")
    assert run.read_text() == "4242 777\n"
    assert said.startswith("nvidia-smi not started: PID 4242, left by an earlier run, "
                           "waiting in the GPU driver (state D)"), said
    assert said.endswith(f"(to try nvidia-smi all the same, delete {run})"), said
    # A note where another user could have put it (/tmp/fleetclean-lock-0) is not root's.
    run.unlink()
    planted.write_text("4242 777\n")
    assert noted(notes) == ""
    assert planted.exists()


def test_a_note_of_none_still_waiting_is_removed(tmp_path: Path) -> None:
    run = tmp_path / "run-note"
    notes = f"FC_SMI_NOTES=({run} /-/x /-/y)\n"
    # Another process under the PID (another start time), and one no longer in the driver.
    run.write_text("4242 778\n4343 777\n")
    assert noted(notes) == ""
    assert not run.exists()
    run.write_text("garbage\n4242 777\n")
    assert noted(notes).startswith("nvidia-smi not started: PID 4242,")
    assert run.exists()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory nobody can reach (pytest's own are root's alone)."""
    with tempfile.TemporaryDirectory(prefix="fc-notes-") as d:
        Path(d).chmod(0o755)
        yield Path(d)


def test_another_login_reads_its_own_notes_and_roots(shared: Path) -> None:
    first, second, root = shared / "first", shared / "second", shared / "root-note"
    for d in (first, second):
        d.mkdir(mode=0o755)  # open to look into: only its owner counts
    os.chown(second, NOBODY, NOBODY)
    # Its note's places: its /tmp/fleetclean-lock-UID (here another user's, taken first),
    # else its directory under XDG_RUNTIME_DIR.
    notes = f"FC_SMI_NOTES=({root} {first}/smi-stuck {second}/smi-stuck)\n"
    said = noted(notes + "fc_smi_note $'4242 777\\n'", NOBODY)
    assert (second / "smi-stuck").read_text() == "4242 777\n"
    assert not (first / "smi-stuck").exists()
    assert said.startswith("nvidia-smi not started: PID 4242,"), said
    assert said.endswith(f"delete {second}/smi-stuck)"), said
    # The first place its own later (made anew): the note in the second is still read.
    os.chown(first, NOBODY, NOBODY)
    assert noted(notes, NOBODY).startswith("nvidia-smi not started: PID 4242,")
    # Root's note is read by every login; not removed by one that does not own it.
    (second / "smi-stuck").unlink()
    root.write_text("4242 777\n")
    said = noted(notes, NOBODY)
    assert said.endswith(f"delete {root} as root)"), said
    root.write_text("4343 777\n")
    assert noted(notes, NOBODY) == "" and root.exists()
    # One in a directory another user owns is never read.
    root.unlink()
    os.chown(first, 0, 0)
    (first / "smi-stuck").write_text("4242 777\n")
    assert noted(notes, NOBODY) == ""


def test_a_call_that_did_not_answer_is_found_three_shells_down_and_killed(
        tmp_path: Path) -> None:
    """fc_smi_hung looks for this script's nvidia-smi among its children, theirs and
    theirs again (bash 4.4 runs a command substitution in a subshell as a shell of its
    own). Here a stand-in called nvidia-smi (sleep, under that name) two shells down: it
    is found, killed, and said so; the script's other child is left alone."""
    smi = tmp_path / "nvidia-smi"
    smi.symlink_to("/bin/sleep")
    script = (template("lib.sh") + f"""
FC_SMI_TIMEOUT=0.2
exec {{fd}}< <(exec 2>/dev/null; bash -c '{smi} 10; :'; :)
sleep 10 &
other=$!
fc_nap 0.3
fc_smi_take "$fd"
echo "rc=$? $REPLY"
kill -0 "$other" && echo "other alive"
kill "$other"
""")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    assert "rc=124 nvidia-smi did not answer in 0.2s (smi_timeout) and was killed (PID " \
        in out, out
    assert "other alive" in out, out


def test_the_shells_waiting_for_one_left_in_the_driver_are_killed(tmp_path: Path) -> None:
    """Where the call outlives SIGKILL (stood in for: fc_smi_in_driver says so), the two
    shells above it, which would wait for it as long, are killed too, and it is noted;
    the script's other child is left alone."""
    smi = tmp_path / "nvidia-smi"
    smi.symlink_to("/bin/sleep")
    note = tmp_path / "note"
    script = (template("lib.sh") + STUB.replace("$1 == 4242", "$1 == $FC_TEST_SMI") + f"""
FC_SMI_NOTES=({note} /-/x /-/y) FC_SMI_TIMEOUT=0.2
exec {{fd}}< <(exec 2>/dev/null; bash -c '{smi} 10; :'; :)
sub=$!
sleep 10 &
other=$!
fc_nap 0.3
read -r inner </proc/$sub/task/$sub/children
read -r FC_TEST_SMI </proc/$inner/task/$inner/children
fc_smi_take "$fd"
echo "rc=$? $REPLY"
fc_nap 0.2
for p in $sub $inner; do
    s=gone
    [[ -e /proc/$p/stat ]] && read -r _ _ s _ </proc/$p/stat
    echo "shell $s"
done
kill -0 "$other" && echo "other alive"
kill "$other"
""")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    assert "rc=124 nvidia-smi did not answer in 0.2s (smi_timeout): PID " in out, out
    assert "outlived SIGKILL, waiting in the GPU driver (state D)" in out, out
    assert [line.split()[1] in ("gone", "Z") for line in out.splitlines()
            if line.startswith("shell ")] == [True, True], out
    assert "other alive" in out, out
    assert note.read_text().endswith(" 777\n")


def test_a_trapped_signal_during_the_read_does_not_cut_it_short() -> None:
    """fc_smi_read takes any read status over 128 for its deadline. A signal the script
    traps (a reset's TERM, a teardown's HUP) while it waits runs its trap, and bash (4.4
    and 5.x alike) goes on reading: the answer that comes after it is taken, not called
    hung."""
    script = template("lib.sh") + """
FC_SMI_TIMEOUT=3
trap 'echo trapped' USR1
exec {fd}< <(sleep 0.6; printf 'answer\\n@0')
(sleep 0.2; kill -USR1 $$) &
fc_smi_take "$fd"
echo "rc=$? $REPLY"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    assert out.splitlines() == ["trapped", "rc=0 answer"], out
