"""A status script parses at once only what a node with idle GPUs runs (``engine/lazy.py``);
the rest, after the script's end in two groups, is parsed a group at the first call of any
of it.

Checked with bash itself: the cut finds every function bash defines from each packaged
file; once loaded, the script has every definition the whole library gives; the rest is
found however the script is started (a file, ``bash -c``, ``bash -s``, the SSH start);
a script whose end is missing stops with a message. In a simulated node, a status on idle
GPUs parses neither group, and one on busy GPUs parses the first once and names the workers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.engine import lazy
from fleetclean.engine.model import Scope
from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.render import Renderer, carried, library, read_whole
from fleetclean.engine.stages import template
from fleetclean.engine.variables import resolve
from fleetclean.sim import SimFleet
from fleetclean.transport.boot import command, first_read

STAGES = Path(__file__).resolve().parents[2] / "fleetclean" / "engine" / "stages"


def bash(script: str, *args: str, stdin: str = "", env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script, "bash", *args], input=stdin, text=True,
                          capture_output=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def defined(text: str) -> set[str]:
    """The functions bash defines from ``text``, loaded after lib.sh (its shopt)."""
    lib = carried(template("lib.sh"))
    out = bash('eval "$1"; before=$(declare -F); eval "$2"; declare -F | grep -vxF "$before"',
               lib, text)
    assert out.returncode in (0, 1), out.stderr
    return {line.split()[-1] for line in out.stdout.splitlines()}


@pytest.mark.parametrize("path", sorted(STAGES.glob("*.sh")), ids=lambda p: p.name)
def test_the_cut_finds_every_function_bash_defines(path: Path) -> None:
    text = carried(path.read_text(encoding="utf-8"))
    found = {m.group(1) for m in lazy._FUNCTION.finditer(text)}
    if path.name == "lib.sh":
        assert found >= {"fc_rec", "fc_begin", "fc_finish"}
        assert bash('eval "$1"; declare -F | wc -l', text).stdout.strip() == str(len(found))
    else:
        assert found == defined(text)


def status_pieces(last_clean: bool = False, named: str = "") -> tuple[str, ...]:
    return Renderer().pieces(resolve(load_playbook("status"), {}, {}), host_name="node01",
                             last_clean=last_clean, named=named)


# What the host's last status saw, and where each early GPU read's reading code goes: parsed
# at once (0) or in a lazy group (N).
SEEN = [(False, "", 0, 0), (True, "", 0, 1), (False, "9:1", 2, 0)]


@pytest.mark.parametrize(("last_clean", "named", "query_group", "q_group"), SEEN)
def test_a_status_script_once_loaded_has_every_definition_of_the_whole_library(
    last_clean: bool, named: str, query_group: int, q_group: int,
) -> None:
    head, idle, tail, rest = status_pieces(last_clean, named)
    whole = "\n".join(library([resolve(load_playbook("status"), {}, {})]))
    dump = 'declare -f | sed "/^fc_lazy ()/,/^}/d"'
    loaded = bash(f'eval "$1"; FC_SRC=$2; fc_lazy 1 x; fc_lazy 2 y; {dump}', idle,
                  head + idle + tail + rest)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout == bash(f'eval "$1"; {dump}', whole).stdout
    # Naming owners and the rarer rest wait: more than half of the library's text.
    assert len(rest) > len(whole) / 2
    assert "fc_owner_path() { fc_lazy 1 " in idle and "fc_open_fds() { fc_lazy 2 " in idle
    # A host never seen parses both reads' functions at once (the node's count picks one);
    # one seen clean the query's (-q's with the busy tier's: a node in use again); one
    # whose processes were named -q's (the query's with the rarer rest: never its read).
    for name, group in (("fc_verify_read_gpus", query_group), ("fc_verify_read_q", q_group)):
        assert (f"\n{name}() {{\n" if group == 0 else f"\n{name}() {{ fc_lazy {group} ") in idle


def toy(tmp_path: Path, *, cut: bool = False) -> tuple[Path, int]:
    """A script as the renderer lays one out: an idle function calling one of each group."""
    idle, groups = lazy.split('fc_hot() {\n    fc_warm "$1"; fc_cold "$1"\n}\n'
                              'fc_warm() {\n    echo "warm $1 $#"\n}\n'
                              'fc_cold() {\n    echo "cold $1 $#"\n}\n',
                              (frozenset({"fc_hot"}), frozenset({"fc_warm"})))
    end = lazy.end(groups)
    body = f"LC_ALL=C\n{idle}{lazy.loader(groups)}fc_hot one\nexit\n{end[:-3] if cut else end}"
    text = f"#!/usr/bin/env bash\n{read_whole(len(body.encode()))}\n{body}"
    path = tmp_path / "toy.sh"
    path.write_text(text)
    return path, len(text.encode())


@pytest.mark.parametrize("start", ["file", "-c", "-s", "ssh", "sourced"])
def test_the_rest_is_found_however_the_script_is_started(tmp_path: Path, start: str) -> None:
    path, size = toy(tmp_path)
    text = path.read_text()
    run = {"file": lambda: bash('bash "$1"', str(path)),
           "-c": lambda: bash('bash -c "$(cat "$1")"', str(path)),
           "-s": lambda: bash("bash -s", stdin=text),
           "ssh": lambda: bash(command(size), stdin=text),
           "sourced": lambda: bash('bash -c ". \\"\\$0\\"" "$1"', str(path))}[start]
    out = run()
    assert (out.returncode, out.stdout, out.stderr) == (0, "warm one 1\ncold one 1\n", "")
    # One exported from the environment is a stranger's, not the script's text.
    assert bash('FC_SRC=garbage; export FC_SRC; bash "$1"', str(path)).stdout == out.stdout


def test_a_file_called_as_bashs_own_name_for_a_c_string_is_not_taken_for_the_script(
    tmp_path: Path,
) -> None:
    # Under -c a function's outermost source is "environment" (under -s, "main"): a file of
    # that name in the working directory is somebody's, not the script's text. (A here-string
    # under -s is read through a pipe, where the script reads itself: FC_SRC.)
    path, _ = toy(tmp_path)
    for name in ("environment", "main"):
        (tmp_path / name).write_text("unrelated\n")
    for start in ('bash -c "$(cat "$1")"', 'bash -s <"$1"', 'bash -s <<<"$(cat "$1")"'):
        out = bash(f'cd "$2" && {start}', str(path), str(tmp_path))
        assert (out.returncode, out.stdout, out.stderr) == (0, "warm one 1\ncold one 1\n", ""), \
            start


def test_a_script_whose_end_is_missing_stops_with_a_message(tmp_path: Path) -> None:
    path, _ = toy(tmp_path, cut=True)
    out = bash('bash "$1"', str(path))
    assert out.returncode == 3
    assert out.stdout == ""  # each group is found from the end: none is, once it changed
    assert "fc_warm is not defined: the end of the script is missing or changed" in out.stderr


def counted(script: str) -> str:
    """The status script with each group's parse said on stderr, and who asked for it."""
    return script.replace("fc_lazy() {\n", 'fc_lazy() {\n    echo "parsed group $1 for $2" >&2\n',
                          1)


@pytest.mark.sim
def test_an_idle_node_parses_no_group_and_a_busy_one_the_first_once(
    sim_fleet_factory: Callable[..., SimFleet],
) -> None:
    fleet = sim_fleet_factory(1)
    text = counted("".join(status_pieces()))
    fleet.node_path("node01", "/tmp/status.sh").write_text(text)
    # Started as over SSH: the whole text read, then run (transport/boot.py).
    argv = ["bash", "-c", f"{command(len(text.encode()), first_read(text))} </tmp/status.sh"]

    idle = fleet.run_in("node01", argv)
    assert "\tverify\tok\t" in idle.stdout, idle.stdout + idle.stderr
    assert "parsed group" not in idle.stderr
    # A status scoped to a user (--user) says its scope first: that too is an idle node's.
    scoped = counted("".join(Renderer(Scope(user="root")).pieces(
        resolve(load_playbook("status"), {}, {}), host_name="node01")))
    fleet.node_path("node01", "/tmp/scoped.sh").write_text(scoped)
    scoped_start = command(len(scoped.encode()), first_read(scoped))
    res = fleet.run_in("node01", ["bash", "-c", f"{scoped_start} </tmp/scoped.sh"])
    assert "\tscope\troot\t0\t" in res.stdout and "\tverify\tok\t" in res.stdout, res
    assert "parsed group" not in res.stderr

    # A host seen clean last time reads its GPUs with --query-gpu: an idle node's too.
    seen_clean = counted("".join(status_pieces(last_clean=True)))
    fleet.node_path("node01", "/tmp/seen.sh").write_text(seen_clean)
    seen_argv = ["bash", "-c",
                 f"{command(len(seen_clean.encode()), first_read(seen_clean))} </tmp/seen.sh"]
    res = fleet.run_in("node01", seen_argv)
    assert "\tverify\tok\t" in res.stdout and "parsed group" not in res.stderr, res

    workers = fleet.spawn("node01", "sglang", gpus="0-7", mib=4096)
    # Another user's process: its uid read from its status file (root's, from /proc's owner).
    workers += fleet.spawn("node01", "stubborn", gpu=3, mib=512, user="ops")
    for start in (argv, seen_argv):
        busy = fleet.run_in("node01", start)
        assert "\tverify\tdirty\t" in busy.stdout, busy.stdout + busy.stderr
        # The node counts CUDA processes: the busy tier is parsed while -q runs, not after.
        assert busy.stderr.count("parsed group") == 1, busy.stderr
        assert "parsed group 1 for fc_verify_warm" in busy.stderr
        named = {int(line.split("\t")[2]) for line in busy.stdout.splitlines()
                 if line.startswith("@@fleetclean\tproc\t")}
        assert len(named & set(workers)) == 9  # eight TP workers, each on its GPU, and ops's
        users = {line.split("\t")[3] for line in busy.stdout.splitlines()
                 if line.startswith(f"@@fleetclean\tproc\t{workers[-1]}\t")}
        assert users == {"ops"}, busy.stdout

    # A host whose last status named them, and a tmux session's worker (its session's name
    # read from its environment), reads them while nvidia-smi runs: the first group still,
    # once.
    workers += fleet.spawn("node01", "tmux", gpu=0, mib=1024)
    stats = fleet.run_in("node01", ["cat", *(f"/proc/{p}/stat" for p in workers)]).stdout
    hint = " ".join(f"{pid}:{line.rsplit(')', 1)[1].split()[19]}"
                    for pid, line in zip(workers, stats.splitlines(), strict=True))
    hinted = counted("".join(status_pieces(named=hint)))
    fleet.node_path("node01", "/tmp/hinted.sh").write_text(hinted)
    start = command(len(hinted.encode()), first_read(hinted))
    res = fleet.run_in("node01", ["bash", "-c", f"{start} </tmp/hinted.sh"])
    assert "\tverify\tdirty\t" in res.stdout, res.stdout + res.stderr
    assert res.stderr.count("parsed group") == 1 and "parsed group 1" in res.stderr, res.stderr
    assert "@@fleetclean\towner\t" in res.stdout and "\ttmux\t" in res.stdout
