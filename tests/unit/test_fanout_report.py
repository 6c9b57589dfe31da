"""``fleetclean report`` on what real fan-out tools printed (tests/data/fanout), and the
exported bundle's and epilog's bash, without any SSH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from simhelp import RENDERED, Cli, shellcheck_each, shellcheck_path

from fleetclean.engine.export import armored, render_bundle, render_epilog
from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.stages import template
from fleetclean.engine.variables import resolve
from fleetclean.results import saved
from fleetclean.transport.boot import CUT_SHORT

DATA = Path(__file__).parent.parent / "data" / "fanout"
MARKER = "@@fleetclean"


@pytest.mark.parametrize(("name", "tool"), [("clush-b.txt", "clush"), ("pdsh.txt", "pdsh"),
                                            ("srun.txt", "srun")])
def test_each_tools_saved_output_reads_as_the_run_it_was(cli: Cli, name: str, tool: str) -> None:
    text = (DATA / name).read_text()
    assert saved.detect(text) == tool
    res = cli("report", "--json", DATA / name)
    hosts = {h["host"]: h for h in res.json()["hosts"]}
    assert hosts["node01"]["status"] == "dirty"
    assert [g["memory_used_mib"] for g in hosts["node01"]["gpus"]] == [0, 0, 20480, 0, 0, 0, 0, 0]
    assert hosts["node01"]["error"].startswith("GPU2 20480 MiB; held by")
    assert hosts["node02"]["status"] == "clean"
    if tool == "pdsh":  # node09 did not resolve: the table says so, exit status 2
        assert hosts["node09"]["status"] == "unreachable"
        assert "Could not resolve hostname node09" in hosts["node09"]["error"]
        assert res.code == 2
    else:
        assert sorted(hosts) == ["node01", "node02"]
        assert res.code == 1
    table = cli("report", DATA / name)
    assert "node01: dirty: GPU2 20480 MiB" in table.out
    assert "--check" not in table.out  # status is read-only: nothing to list


def test_a_clush_block_shared_by_several_hosts_gives_each_its_records() -> None:
    lines = ["@@fleetclean\tbegin\t1\tstatus\tnode\t1", "@@fleetclean\tdone\t0"]
    text = "\n".join(["---------------", "node[01-02,05] (3)", "---------------", *lines, ""])
    outs = saved.split(text, saved.detect(text))
    assert [(o.host, o.records) for o in outs] == [(n, lines) for n in
                                                  ("node01", "node02", "node05")]


def test_a_blocks_own_text_is_no_host_and_srun_names_the_inventorys_host() -> None:
    # "Note: ..." (a login's startup file) and the bundle's verdict under clush -B became
    # hosts; srun's "gpu01" beside records of "gpu01.lab" became a second host.
    run = ["@@fleetclean\tbegin\t1\tstatus\tgpu01\t1", "@@fleetclean\tdone\t0"]
    text = "\n".join(["---------------", "gpu01", "---------------",
                      "Note: module gcc/12 loaded", *run, "fleetclean: gpu01: clean", ""])
    outs = saved.split(text, saved.detect(text))
    assert [o.host for o in outs] == ["gpu01"]
    assert outs[0].notes == ["Note: module gcc/12 loaded", "fleetclean: gpu01: clean"]
    srun = "\n".join(["0: @@fleetclean\tbegin\t1\tstatus\tgpu01.lab\t1",
                      "0: @@fleetclean\tdone\t0",
                      "srun: error: gpu01: task 0: Exited with exit code 1", ""])
    outs = saved.split(srun, saved.detect(srun))
    assert [(o.host, o.notes) for o in outs] == [("gpu01.lab", ["Exited with exit code 1"])]


@pytest.mark.parametrize(("note", "status"), [
    # ssh's own words are a refusal or a timeout; a host's own are an error.
    ("Permission denied (publickey).", "auth_failed"),
    ("ssh: connect to host node01 port 22: Connection timed out", "timeout"),
    ("bash: /shared/st.sh: Permission denied", "error"),
    ("nvidia-smi: command timed out", "error"),
])
def test_only_ssh_s_own_words_make_a_refusal_or_a_timeout(note: str, status: str) -> None:
    assert saved.failure([note])[0] == status


def test_a_record_keeps_its_empty_last_fields() -> None:
    # Stripped of its trailing tabs, a "left" process with no command line was dropped.
    record = "@@fleetclean\tleft\t1\t4242\t"
    text = "@@fleetclean\tbegin\t1\tstatus\tgpu01\t1\n" + record + "\n"
    outs = saved.split(text, saved.detect(text))
    assert outs[0].records[-1] == record


def test_an_epilog_log_of_many_jobs_reports_each_hosts_last_run(cli: Cli, tmp_path: Path) -> None:
    def run(host: str, verdict: str) -> str:
        return (f"{MARKER}\tbegin\t1\tpost-extraction\t{host}\t0\n"
                f"{MARKER}\tverify\t{verdict}\t0\t12\twhatever\n{MARKER}\tdone\t0\n"
                f"fleetclean: {host} job 7: {verdict}\n")
    log = tmp_path / "epilog.log"
    log.write_text(run("node01", "dirty") + run("node02", "dirty") + run("node01", "ok"))
    res = cli("report", "--json", log)
    assert {h["host"]: h["status"] for h in res.json()["hosts"]} == {"node01": "clean",
                                                                     "node02": "dirty"}
    assert res.code == 1
    assert cli("report", "--from", "raw", "--json", log).json() == res.json()


def test_a_run_cut_short_is_an_error_and_nothing_at_all_is_bad_input(cli: Cli,
                                                                      tmp_path: Path) -> None:
    cut = tmp_path / "cut.txt"
    cut.write_text(f"node01: {MARKER}\tbegin\t1\tstatus\tnode01\t1\n"
                   f"node01: {MARKER}\tstage\tverify\tverify\tverify\n")
    res = cli("report", "--json", cut)
    assert res.code == 2
    assert "output ended during verification" in res.host("node01")["error"]
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing here\n")
    for bad in (empty, tmp_path / "missing.txt"):
        res = cli("report", bad)
        assert res.code == 4
        assert res.err.count("\n") == 1 and "Traceback" not in res.err


def _bash_without_comments(script: str) -> str:
    """The script's code: no comment lines, and no double-quoted text (a message may name
    `scancel J` as what a person should run; running it is what must not happen)."""
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    return re.sub(r'"[^"\n]*"', '""', code)


def test_the_epilog_calls_no_slurm_command_and_sets_its_own_path() -> None:
    script = render_epilog(resolve(load_playbook("post-extraction"), {}, {}),
                           log="/var/log/fleetclean/epilog.log")
    code = _bash_without_comments(script)
    for command in ("scontrol", "sinfo", "squeue", "srun", "sbatch", "scancel", "sacct"):
        assert not re.search(rf"\b{command}\b", code), command
    assert "\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" in script
    assert "FC_EPILOG_LOG=/var/log/fleetclean/epilog.log" in script


def _shellcheck() -> str | None:
    return shellcheck_path()


@pytest.mark.skipif(_shellcheck() is None, reason="shellcheck not installed")
def test_the_exported_scripts_pass_shellcheck(tmp_path: Path) -> None:
    book = resolve(load_playbook("post-extraction"), {}, {"protect": "jupyter"})
    other = resolve(load_playbook("post-extraction"), {"grace": 3}, {})
    files = {"epilog.sh": render_epilog(book, log="/var/log/fleetclean/epilog.log"),
             "bundle.sh": render_bundle([("gpu01.lab", book), ("gpu02.lab", other)],
                                        playbook="post-extraction")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "armored.sh").write_text(armored(files["bundle.sh"], title="# a bundle"))
    # The armored bundle's last line is reached only where a cut left the one before it a
    # comment (SC2317).
    status, report = shellcheck_each([tmp_path / n for n in [*files, "armored.sh"]],
                                     *RENDERED, extra={"armored.sh": ["-e", "SC2317"]})
    assert status == 0, report


def _pick(bundle_tail: str, host: str) -> subprocess.CompletedProcess[str]:
    """The bundle's host lookup alone: lib.sh and standalone.sh with fc_main_N stubs that
    only say who they are (nothing is looked at or signalled on this machine), after the
    bundle's second line (which says its start came)."""
    script = "\n".join(["FC_BUNDLE_BEGUN=1", template("lib.sh"), template("standalone.sh"),
                        'fc_main_1() { echo "one for $FC_TARGET_HOST"; }',
                        'fc_main_2() { echo "two for $FC_TARGET_HOST"; }', bundle_tail])
    env = {"PATH": os.environ["PATH"], "FLEETCLEAN_HOST": host}
    return subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True,
                          env=env, check=False, timeout=30)


def test_the_bundle_picks_each_hosts_part_by_full_or_short_name() -> None:
    book = resolve(load_playbook("status"), {}, {})
    slow = resolve(load_playbook("status"), {"max_used_mib": 512}, {})
    bundle = render_bundle([("gpu01.lab", book), ("gpu02.lab", slow), ("login", book)],
                           playbook="status")
    assert bundle.count("() {\n") >= 2 and "fc_main_3" not in bundle  # two variants
    tail = bundle[bundle.index("declare -A FC_BUNDLE_FN"):]
    assert "one for gpu01.lab" in _pick(tail, "gpu01").stdout
    assert "two for gpu02.lab" in _pick(tail, "gpu02.lab").stdout
    assert "one for login" in _pick(tail, "login.cluster").stdout
    stranger = _pick(tail, "gpu99")
    assert stranger.returncode == 2
    assert f"{MARKER}\terror\thost gpu99 is not in this bundle" in stranger.stdout
    assert "gpu[01-02].lab,login" in stranger.stdout


def test_a_bundle_mangled_by_pdsh_stops_before_anything_runs() -> None:
    book = resolve(load_playbook("post-extraction"), {}, {})
    plain = render_bundle([("gpu01", book)], playbook="post-extraction")
    guard = plain[plain.index("FC_PERCENT="):plain.index("\nfi\n") + 4]

    def run(text: str) -> subprocess.CompletedProcess[str]:
        # Only the guard runs here (it comes before the library): never a teardown.
        return subprocess.run(["bash", "-c", text + "echo went-on\n"], capture_output=True,
                              text=True, timeout=10, check=False)

    assert run(guard).stdout == "went-on\n"
    mangled = run(guard.replace("%%", "%"))  # what pdsh makes of the plain bundle
    assert mangled.returncode == 2 and "went-on" not in mangled.stdout
    assert "export script --pdsh" in mangled.stderr
    doubled = guard.replace("%", "%%")  # --pdsh's bundle, then pdsh's expansion
    assert run(doubled.replace("%%", "%")).stdout == "went-on\n"


# bash on PATH, and a bash 4.4 (RHEL 8's) where one is given (tests/e2e/test_e2e_old_bash.py).
OLD_BASH = os.environ.get("FLEETCLEAN_TEST_OLD_BASH", "")
BASHES = [shutil.which("bash") or "/bin/bash",
          pytest.param(OLD_BASH, marks=pytest.mark.skipif(
              not OLD_BASH, reason="no bash 4.4 given (FLEETCLEAN_TEST_OLD_BASH=PATH)"))]


@pytest.mark.parametrize("bash", BASHES)
def test_a_bundle_whose_start_is_taken_runs_whole_or_not_at_all(tmp_path: Path,
                                                                bash: str) -> None:
    """What ``bash -s`` does with every tail of an armored bundle (the start a login shell's
    startup file took): cut anywhere, it runs the whole script (where what is left of the
    first line starts a bash) or nothing of it; cut in its second line or in the base64,
    it says it came cut short. The script here only writes a file in tmp_path, and exits 1
    (a dirty host's status, which must come through)."""
    plain = "\n".join(["#!/usr/bin/env bash", "FC_BUNDLE_BEGUN=1",
                       *(f"f{i}() {{ echo {i} >> ran.txt; }}" for i in range(40)),
                       "f7", "echo whole", "exit 1"]) + "\n"
    text = armored(plain, title="# fleetclean: a bundle for 2 hosts: gpu[01-02]").encode()
    first = text.index(b"\n") + 1
    # The line that reads ahead under bash -s, the string, the line that closes it.
    ahead, string = text.index(b"\n", first) + 1, text.index(b"FC_BUNDLE_B64='\n")
    end = text.rindex(b"\n'\n") + 1
    ran = tmp_path / "ran.txt"
    env = {"PATH": "/usr/bin:/bin"}

    def run(argv: list[str], stdin: bytes = b"") -> tuple[int, bytes, bytes, str]:
        ran.unlink(missing_ok=True)
        res = subprocess.run(argv, input=stdin, capture_output=True, cwd=tmp_path, env=env,
                             timeout=10, check=False)
        return res.returncode, res.stdout, res.stderr, ran.read_text() if ran.exists() else ""

    whole = (1, b"whole\n", b"", "7\n")
    assert run([bash, "-s"], text) == whole
    # A login shell's PATH without coreutils: it decodes with the system's own (command -p).
    env["PATH"] = "/nonexistent"
    assert run([bash, "-s"], text) == whole
    env["PATH"] = "/usr/bin:/bin"
    # As a file (srun) and as a -c string (pdsh) it runs whole too.
    (tmp_path / "bundle.sh").write_bytes(text)
    assert run([bash, "bundle.sh"]) == whole
    assert run([bash, "-c", text.decode()]) == whole
    # Its end lost on the way (a dropped connection): nothing runs either.
    code, _, err, wrote = run([bash, "-s"], text[:len(text) // 2])
    assert (code, wrote) == (2, "") and b"its end is missing" in err
    # Every cut, but inside the base64 lines (half the text, alike byte for byte: each
    # tail is a line of base64 words, then the same end) every sixth, besides the first
    # and last line's: each is a bash start, and the whole took 18 s of the suite.
    body = text.index(b"\n", string) + 1
    lines = range(text.index(b"\n", body) + 1, text.rindex(b"\n", body, end - 1))
    for cut in range(1, len(text)):
        if cut in lines and cut % 6:
            continue
        code, out, err, wrote = run([bash, "-s"], text[cut:])
        if cut <= first and out:  # the first line's tail failed or started a bash: whole
            assert (code, out, wrote) == (1, b"whole\n", "7\n") and b"cut" not in err, cut
            continue
        assert (out, wrote) == (b"", ""), (cut, out, err)
        # Else a tail of the first line (`sh`: dash fails on the rest), of the read-ahead
        # line or of one after the string: a syntax error, or a comment.
        if first <= cut < ahead or string <= cut < end:
            assert code == 2 and CUT_SHORT.encode() in err, (cut, err[-300:])


def test_a_host_whose_bundle_came_cut_is_explained() -> None:
    """What report says of a host that printed no record: cut short (said by the bundle, or
    a cut line bash could not parse), or cut at its end."""
    startup = saved.failure(["bash: line 1: QUJD=: command not found",
                             f"{CUT_SHORT} (its beginning is missing)"])
    assert startup[0] == "error" and "~/.bashrc" in startup[1]
    unparsed = saved.failure(["bash: line 1: syntax error near unexpected token `fi'",
                              "bash: line 1: `fi; }'"])
    assert unparsed[1].startswith(CUT_SHORT) and "~/.bashrc" in unparsed[1]
    dropped = saved.failure([f"{CUT_SHORT} (its end is missing)"])
    assert "before its end" in dropped[1] and "~/.bashrc" not in dropped[1]
    assert saved.failure(["bash: nvidia-smi: command not found"])[1] == \
        "bash: nvidia-smi: command not found"


def test_an_epilog_waits_its_turn_for_the_nodes_lock(cli: Cli) -> None:
    # slurmd runs a node's epilogs at once: 5 s, then "host busy" (exit 2), drained it.
    assert "FC_LOCK_WAIT=600\n" in cli("export", "slurm-epilog", "post-extraction").out
    given = cli("export", "slurm-epilog", "post-extraction", "-e", "lock_wait=30").out
    assert "FC_LOCK_WAIT=30\n" in given


def test_a_saved_outputs_host_and_playbook_names_reach_the_terminal_escaped(
    cli: Cli, tmp_path: Path
) -> None:
    # The names come from the file's own records: an escape sequence in them retitled or
    # cleared the terminal of whoever read the report.
    path = tmp_path / "out.txt"
    path.write_text("\t".join([MARKER, "begin", "1", "st%1B]0%3Bpb%07", "gpu01%1B[2J", "1"])
                    + "\n" + "\t".join([MARKER, "done", "0"]) + "\n")
    out = cli("report", path).out
    assert "\x1b" not in out and "\x07" not in out
    assert "gpu01\\x1b[2J" in out and "st\\x1b]0;pb\\x07" in out


def test_a_reader_that_goes_away_early_leaves_the_exit_status_to_the_hosts(
    tmp_path: Path,
) -> None:
    # The --check listing comes after the table: a `| head` gone by then made the CLI's
    # handler exit 0 for a dirty host.
    rec = lambda *f: "\t".join([MARKER, *f]) + "\n"  # noqa: E731
    text = (rec("begin", "1", "post-extraction", "gpu01", "1") + rec("stage", "1", "rm", "remove")
            + "".join(rec("change", "1", f"would remove /dev/shm/x/{i}") for i in range(4000))
            + rec("end", "1", "changed", "4000", "0", "0", "1", "would remove")
            + rec("stage", "verify", "verify", "verify")
            + rec("gpu", "0, GPU-a, NVIDIA H200, 20480, 143771")
            + rec("verify", "dirty", "0", "100", "x") + rec("done", "0"))
    path = tmp_path / "out.txt"
    path.write_text(text)
    done = subprocess.run(
        ["bash", "-c", '"$0" -m fleetclean report "$1" | head -c 100 >/dev/null; '
         'echo "${PIPESTATUS[0]}"', sys.executable, str(path)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "COLUMNS": "200"})
    assert done.stdout.strip() == "1", (done.stdout, done.stderr)
