"""The command that starts a script over SSH (``transport.boot``), run as a login shell
would run it (``sh -c COMMAND``, and the same by bash, zsh, tcsh and fish) with the script
on standard input: the whole script runs,
a script whose start something else read first runs not at all, and a status script's early
reads start under it as under ``bash -s``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import SMI_NOTES, UVM_REFCNT, render_script
from fleetclean.engine.variables import resolve
from fleetclean.results.parse import parse_script_output
from fleetclean.transport.boot import BASH, CUT_SHORT, command, first_read

SCRIPT = "#!/usr/bin/env bash\n# héllo ✓: bytes, not characters\necho ran > \"$OUT\"\n"


LOGIN_SHELLS = ("sh", "bash", "zsh", "tcsh", "fish")


def login_shell(script: bytes, size: int, env: dict[str, str],
                shell: str = "sh", first: str = "") -> subprocess.CompletedProcess[str]:
    sh = shutil.which(shell)
    if sh is None:
        pytest.skip(f"no {shell} here (scripts/dev setup installs it)")
    return subprocess.run([sh, "-c", command(size, first)], input=script.decode(), check=False,
                          capture_output=True, encoding="utf-8", timeout=30,
                          env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **env})


def test_the_command_is_one_line_any_login_shell_takes_alike() -> None:
    cmd = command(36109)
    assert "\n" not in cmd and "!" not in cmd
    assert cmd.startswith(f"{BASH} -c '") and "36109" in cmd


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
def test_the_whole_script_runs_and_a_cut_one_runs_nothing(tmp_path: Path, shell: str) -> None:
    out = tmp_path / "out"
    data = SCRIPT.encode()
    whole = login_shell(data, len(data), {"OUT": str(out)}, shell)
    assert whole.returncode == 0, whole.stderr
    assert out.read_text() == "ran\n"

    out.unlink()
    # What ~/.bashrc left of it after reading its first bytes.
    cut = login_shell(data[10:], len(data), {"OUT": str(out)}, shell)
    assert cut.returncode == 1
    assert CUT_SHORT in cut.stderr and f"of {len(data)} bytes" in cut.stderr
    assert not out.exists()
    # The controller says what to look at.
    error = parse_script_output("", cut.stderr, cut.returncode).error or ""
    assert "~/.bashrc" in error and "nothing was run" in error


# What an HPC node's startup files may export to every bash (Lmod sets BASH_ENV; a
# site may `export -f` a wrapper; `set -e; export SHELLOPTS` in a ~/.bashrc). The child
# bash stands for a shell stage's command, which gets the login's environment as it is.
HOSTILE = r"""#!/usr/bin/env bash
false
[[ ABC == abc ]] && echo "case-blind" >> "$OUT"
re='a.c'; [[ abc =~ "$re" ]] && echo "compat-31" >> "$OUT"
echo "fn=$(type -t nvidia-smi || echo none) unset=${never_set}." >> "$OUT"
bash -c 'echo "child: p=${-//[!p]/} fn=$(type -t nvidia-smi)"' >> "$OUT"
"""


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
def test_what_the_environment_exports_to_every_bash_never_reaches_the_script(
    tmp_path: Path, shell: str
) -> None:
    out, sourced = tmp_path / "out", tmp_path / "sourced"
    (tmp_path / "env.sh").write_text(
        f'tr "\\0" " " </proc/$$/cmdline >> {sourced}; echo >> {sourced}\n'
        "set -o errexit -o nounset\n")
    data = HOSTILE.encode()
    res = login_shell(data, len(data), {
        "OUT": str(out), "BASH_ENV": str(tmp_path / "env.sh"),
        "SHELLOPTS": "errexit:nounset", "BASHOPTS": "nocasematch", "BASH_COMPAT": "31",
        "BASH_FUNC_nvidia-smi%%": "() { echo 'No devices were found'; return 6; }"}, shell)
    assert res.returncode == 0, res.stderr
    # dash (sh) passes on no variable whose name is not a shell name: no function to find.
    child_fn = "" if shell == "sh" else "function"
    assert out.read_text() == f"fn=none unset=.\nchild: p= fn={child_fn}\n"
    # A login shell that is bash sources BASH_ENV, and so does the child; the script's
    # bash never does.
    lines = sourced.read_text().splitlines()
    assert not [line for line in lines if line.startswith(f"{BASH} -c ")], lines
    assert [line for line in lines if line.startswith("bash -c echo")], lines
    assert len(lines) == 1 + (shell == "bash"), lines


def test_an_exported_tmout_gives_the_scripts_reads_no_deadline(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = b'read -r x < <(sleep 1.5; echo late); echo "$x" > "$OUT"\n'
    res = login_shell(data, len(data), {"OUT": str(out), "TMOUT": "1"})
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "late\n"


# bash 4.4 (RHEL 8) is not Debian's: tests/e2e/test_e2e_old_bash.py says how to build one.
OLD_BASH = os.environ.get("FLEETCLEAN_TEST_OLD_BASH", "")
BASHES = [pytest.param("", id="bash"),
          pytest.param(OLD_BASH, id="bash-4.4", marks=pytest.mark.skipif(
              not OLD_BASH, reason="no bash 4.4 given (FLEETCLEAN_TEST_OLD_BASH=PATH)"))]


@pytest.mark.parametrize("old_bash", BASHES)
@pytest.mark.parametrize("start", ["ssh", "stdin"])
def test_an_exported_posixly_correct_leaves_the_script_out_of_posix_mode(
    tmp_path: Path, start: str, old_bash: str
) -> None:
    # bash turns POSIX mode on where POSIXLY_CORRECT is exported, and bash 4.4 in it takes a
    # process substitution (the status's first GPU read) for a syntax error.
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "dmesg"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$1"\n')
        (bin_dir / name).chmod(0o755)
    if old_bash:
        (bin_dir / "bash").symlink_to(old_bash)
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n",
                           last_clean=True)
    body = ('read -r gpu <&"$FC_VGFD"; read -r here < <(echo procsub); '
            '[[ -o posix ]] && p=on || p=off; echo "$gpu|$here|$p|$POSIXLY_CORRECT" >"$OUT"\n')
    script = ("\n".join(status.split("\n")[:5]) + "\n" + body).encode()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "POSIXLY_CORRECT": "1", "OUT": str(out)}
    if start == "ssh":
        done = login_shell(script, len(script), env, first=first_read(status))
    else:  # as the local connection and sudo's bash start it
        bash = shutil.which("bash", path=env["PATH"]) or "bash"
        done = subprocess.run([bash, *BASH.split()[1:], "-s"], input=script, check=False,
                              capture_output=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    # The script's bash is out of POSIX mode (and bash unset the variable as it left it).
    want = "nvidia-smi --query-gpu=index,uuid,name,memory.used,memory.total|procsub|off|"
    assert out.read_text() == want + "\n"


def counted(text: str, tmp_path: Path, count: str | None) -> str:
    """``text`` with its read of the node's count of CUDA processes (render.UVM_REFCNT)
    made of a file holding ``count`` (None: a file that is not there, as where the
    nvidia_uvm module was never loaded)."""
    path = tmp_path / "refcnt"
    if count is not None:
        path.write_text(count)
    return text.replace(UVM_REFCNT, str(path))


def test_the_count_read_is_the_one_the_simulator_keeps() -> None:
    from fleetclean.sim import uvm_count

    assert uvm_count.REFCNT == UVM_REFCNT == "/sys/module/nvidia_uvm/refcnt"


# The node's count as the kernel writes it, and the read it makes the script start for a
# host never seen and for one seen clean: where it cannot be read (no file, as on a node
# whose sysfs does not show its modules), the read the controller's hint picks.
COUNTS = [("0\n", "FC_VGFD", "FC_VGFD"), ("3\n", "FC_VQFD", "FC_VQFD"),
          (None, "FC_VQFD", "FC_VGFD"), ("", "FC_VQFD", "FC_VGFD")]


Reads = tuple[str | None, str, str]  # a COUNTS entry


@pytest.mark.parametrize("reads", COUNTS)
@pytest.mark.parametrize("last_clean", [False, True])
@pytest.mark.parametrize("exported", [False, True])
def test_a_status_scripts_early_reads_start_under_it(tmp_path: Path, exported: bool,
                                                     last_clean: bool, reads: Reads) -> None:
    count, new, seen_clean = reads
    fd = seen_clean if last_clean else new
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "dmesg"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$1\"\n")
        (bin_dir / name).chmod(0o755)
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n",
                           last_clean=last_clean)
    # shebang, directive, POSIX_OFF, the GPU read, the kernel log
    early = counted(status, tmp_path, count).split("\n")[:5]
    body = (f'printf "%s|" "${fd}" "$FC_VXIDFD" "${{FC_VQFD:-}}${{FC_VGFD:-}}" "${{FC_UVM@a}}"; '
            f'cat <&"${fd}"; cat <&"$FC_VXIDFD"\n')
    script = ("\n".join(early) + "\n" + body).encode()
    # A descriptor number in the environment is a stranger's: the script starts its own;
    # a count there is not the node's, nor passed on to what the script starts.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin",
           **({"FC_VQFD": "1", "FC_VGFD": "2", "FC_UVM": "7"} if exported else {})}
    done = login_shell(script, len(script), env)
    assert done.returncode == 0, done.stderr
    vg, vx, both, attrs, rest = done.stdout.split("|", 4)
    # One read started, the one the count asks for.
    assert int(vg) >= 10 and int(vx) >= 10 and vg != vx and both == vg and "x" not in attrs
    query = "-q" if fd == "FC_VQFD" else "--query-gpu=index,uuid,name,memory.used,memory.total"
    assert rest.startswith(f"nvidia-smi {query}\n") and rest.endswith("dmesg -l\n")


@pytest.mark.parametrize("count", ["0\n", "3\n"])
def test_a_note_of_a_hung_driver_starts_no_gpu_read_whatever_the_count(tmp_path: Path,
                                                                         count: str) -> None:
    """Where an earlier run's nvidia-smi waits in a hung driver (its note: render.SMI_NOTES),
    the early read starts neither nvidia-smi, whichever the node's count picks, and leaves
    both descriptors unset (the verification then asks the note first: lib.sh)."""
    bin_dir, calls, note = tmp_path / "bin", tmp_path / "calls", tmp_path / "smi-stuck"
    bin_dir.mkdir()
    note.write_text("")
    for name in ("nvidia-smi", "dmesg"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} >>"{calls}"\n')
        (bin_dir / name).chmod(0o755)
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n")
    early = counted(status, tmp_path, count).replace(SMI_NOTES[0], str(note)).split("\n")[:5]
    body = 'printf "%s|%s|" "${FC_VQFD:-}" "${FC_VGFD:-}"; cat <&"$FC_VXIDFD" >/dev/null\n'
    script = ("\n".join(early) + "\n" + body).encode()
    done = login_shell(script, len(script), {"PATH": f"{bin_dir}:/usr/bin:/bin"}, "sh",
                       first_read(counted(status, tmp_path, count).replace(SMI_NOTES[0],
                                                                           str(note))))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "||" and calls.read_text().split() == ["dmesg"]


@pytest.mark.parametrize("shell", LOGIN_SHELLS)
@pytest.mark.parametrize("reads", COUNTS[:3])
@pytest.mark.parametrize("last_clean", [False, True])
def test_the_command_starts_a_status_scripts_gpu_read_once(tmp_path: Path, shell: str,
                                                            last_clean: bool,
                                                            reads: Reads) -> None:
    count, new, seen_clean = reads
    fd = seen_clean if last_clean else new
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "dmesg"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} >>"{calls}"\necho {name} "$1"\n')
        (bin_dir / name).chmod(0o755)
    status = counted(render_script(resolve(load_playbook("status"), {}, {}), host_name="n",
                                   last_clean=last_clean), tmp_path, count)
    first = first_read(status)
    assert first.startswith("unset FC_VQFD FC_VGFD FC_UVM; ") and "nvidia-smi" in first
    early = status.split("\n")[:5]
    body = (f'printf "%s|" "${fd}"; cat <&"${fd}"; echo "|${{{fd}@a}}|"; '
            'cat <&"$FC_VXIDFD" >/dev/null\n')
    script = ("\n".join(early) + "\n" + body).encode()
    # An exported number is a stranger's: the command starts its own read, and the script's
    # own line then finds it and starts none.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", fd: "1"}
    done = login_shell(script, len(script), env, shell, first)
    assert done.returncode == 0, done.stderr
    number, read, attrs, _ = done.stdout.split("|")
    assert int(number) >= 10 and "x" not in attrs
    assert read.startswith(f"nvidia-smi {'-q' if fd == 'FC_VQFD' else '--query-gpu'}")
    assert read.endswith("\n@0")
    assert sorted(calls.read_text().split()) == ["dmesg", "nvidia-smi"]  # each once


def test_a_script_without_an_early_read_starts_nothing_first() -> None:
    teardown = render_script(resolve(load_playbook("post-extraction"), {}, {}), host_name="n")
    assert first_read(teardown) == ""
    # A line shaped like one, but that a login shell would not pass alike, is not taken.
    odd = "#!/usr/bin/env bash\n#\n[[ -n ${FC_VGFD:-} && ${FC_VGFD@a} != *x* ]] || { echo '!'; }\n"
    assert first_read(odd) == ""


def test_a_cut_status_script_ends_without_waiting_for_its_gpu_read(tmp_path: Path) -> None:
    # The read the command started holds only its pipe: a run cut short (nothing of the
    # script run) ends at once, though its nvidia-smi still runs (it only reads).
    bin_dir, pid_file = tmp_path / "bin", tmp_path / "pid"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho $$ >"{pid_file}"\nexec sleep 30\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    status = render_script(resolve(load_playbook("status"), {}, {}), host_name="n",
                           last_clean=True).encode()
    try:
        cut = login_shell(status[:20000], len(status), {"PATH": f"{bin_dir}:/usr/bin:/bin"},
                          first=first_read(status.decode()))
        assert cut.returncode == 1 and CUT_SHORT in cut.stderr
        # The read starts in the background: its PID comes soon, then its exec of sleep
        # (the stub writes the PID first: on a loaded machine the exec may come later).
        cmdline = b""
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{int(pid_file.read_text())}/cmdline").read_bytes()
                if cmdline.startswith(b"sleep\0"):
                    break
            time.sleep(0.05)
        # Still reading when the run came back: nothing waited for it.
        assert cmdline.startswith(b"sleep\0"), cmdline
    finally:
        if pid_file.exists() and pid_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
