"""A teardown whose controller goes away (a laptop's network drops, fleetclean is killed)
finishes on the node by itself, and the host's next run says what it did: never a node
left with its server stopped, a GPU still held and its patched file in place, and no word
of it anywhere."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from simhelp import Cli, alive, spawn_cli, wait_for

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim
MODEL = "/tmp/sglang/models/deepseek_v2.py"
JOURNAL = "/run/fleetclean-lock/journal"


def kill_at_first_signal(proc: subprocess.Popen[str], journal: Path) -> None:
    """SIGKILL the controller (no goodbye) once the node's journal shows its first signal."""
    try:
        deadline = time.monotonic() + 60
        while "\tsignal\t" not in (journal.read_text() if journal.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # our own child, by PID
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for_record(journal: Path, kind: str, seconds: float = 60) -> None:
    """Until the node's journal holds a record of ``kind`` (``gone``, ``done``); after
    ``done``, until the run let go of the host's lock too (a status that finds the lock
    still held and the run done leaves the telling to the next run)."""
    wait_for(f"a {kind} record in the journal",
             lambda: journal.exists() and f"\t{kind}\t" in journal.read_text(), seconds)
    if kind == "done":
        wait_for("the lone run's lock let go", lambda: _lock_free(journal.parent / "lock"),
                 seconds)


def _lock_free(path: Path) -> bool:
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def told(host: dict[str, Any], what: str = "lost its controller") -> list[str]:
    """What a run said of a teardown on the host that lost its controller (its warnings)."""
    return [w for w in host["warnings"] if what in w]


def patched_and_busy(fleet: SimFleet) -> tuple[list[int], list[int]]:
    """node01 with its model file patched (the original beside it), a server that ignores
    SIGTERM (a teardown waits out its grace, then SIGKILLs it) and a GPU holder: the
    server's and the holder's PIDs."""
    fleet.run_in("node01", ["mkdir", "-p", MODEL.rsplit("/", 1)[0]])
    fleet.node_path("node01", MODEL).write_text("patched: dump hidden states\n")
    fleet.node_path("node01", MODEL + ".bak_hsdump").write_text("original\n")
    server = fleet.spawn("node01", "stubborn", gpu=0, name="python3 -m sglang.launch_server")
    return server, fleet.spawn("node01", "stubborn", gpu=6)


def test_a_teardown_whose_controller_dies_finishes_alone_and_the_next_run_says_so(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    server, holder = patched_and_busy(fleet)
    proc = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(fleet.inventory_path),
                     "-e", f"model_file={MODEL}", "-e", "grace=3", "--json")
    # The controller dies once the server has had its SIGTERM.
    journal = fleet.node_path("node01", JOURNAL)
    kill_at_first_signal(proc, journal)

    # The node goes on alone: the server gets its SIGKILL after its grace, the holder its
    # signals, the model file comes back, the GPUs are free.
    wait_for_record(journal, "done")
    assert alive(fleet, "node01", server + holder) == []
    assert fleet.node_path("node01", MODEL).read_text() == "original\n"
    assert fleet.gpu_used_mib("node01") == [0] * 8

    status = cli("status", "-i", fleet.inventory_path, "--json")
    host = status.host("node01")
    assert host["status"] == "clean"
    (said,) = told(host)
    assert said.startswith("the post-extraction run begun here at ")
    # The server's SIGTERM went out before; its SIGKILL, the holder's TERM and KILL after.
    assert "went on alone (4 signals sent in all, 3 after that); it ended clean" in said, said
    # Said once.
    again = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert not told(again)


def test_a_teardown_that_keeps_its_controller_leaves_nothing_to_tell(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli
) -> None:
    fleet = sim_fleet_factory(1)
    fleet.spawn("node01", "stubborn", gpu=6)
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    assert res.host("node01")["status"] == "clean"
    assert nothing_lost_left(fleet)
    status = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert status["warnings"] == []


def nothing_lost_left(fleet: SimFleet) -> bool:
    """No journal of a run that lost its controller on node01: the last one, heard to its
    end as far as the node could tell, kept only as "heard.TOKEN" (asked for by the
    controller where it did not hear that end)."""
    journal = fleet.node_path("node01", JOURNAL)
    return (not journal.exists() or journal.read_text() == "") and any(
        "\tdone\t" in f.read_text() for f in heard(fleet))


def heard(fleet: SimFleet) -> list[Path]:
    """node01's heard journals: the teardowns that saw no sign of losing their controller."""
    return sorted(fleet.node_path("node01", JOURNAL).parent.glob("heard.*"))


# A ProxyCommand that relays the controller's connection and writes its PID first: the
# test stops it (SIGSTOP) to stall the connection without an error, as a network that drops
# silently does; sshd goes on taking the script's output (into the relay's socket).
RELAY = """\
import os, selectors, socket, sys
sock = socket.create_connection((sys.argv[2], int(sys.argv[3])))
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(sock, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fd == 0:
            data = os.read(0, 65536)
            if not data:
                sys.exit(0)
            sock.sendall(data)
        else:
            data = sock.recv(65536)
            if not data:
                sys.exit(0)
            os.write(1, data)
"""


def test_a_teardown_whose_connection_stalls_silently_is_told_by_the_next_status(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    server, holder = patched_and_busy(fleet)
    relay, pidfile = tmp_path / "relay.py", tmp_path / "relay.pid"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node01\n    ProxyCommand {sys.executable} {relay} {pidfile} %h %p\n"
                      + fleet.ssh_config_path.read_text())
    # The host by its name alone: the sim's ssh_config gives its address.
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("node01\n")
    proc = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(inventory),
                     "-F", str(config), "-e", f"model_file={MODEL}", "-e", "grace=3",
                     "--json")
    journal = fleet.node_path("node01", JOURNAL)
    try:
        wait_for("the first signal", lambda: "\tsignal\t" in (
            journal.read_text() if journal.exists() else ""), 60)
        os.kill(int(pidfile.read_text()), signal.SIGSTOP)  # the relay this test wrote, by PID
        # The node finishes alone and sees no sign of trouble: its journal kept as heard.
        wait_for("the journal kept as heard", lambda: any(
            "\tdone\t" in f.read_text() for f in heard(fleet)), 60)
        wait_for("the lone run's lock let go", lambda: _lock_free(journal.parent / "lock"), 60)
        assert alive(fleet, "node01", server + holder) == []
        assert fleet.node_path("node01", MODEL).read_text() == "original\n"
    finally:
        stop_relay(pidfile)  # the end it had taken in never reaches the controller
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by PID
            out, err = proc.communicate()
    assert proc.returncode == 2, err  # the host failed: its end never came
    assert json.loads(out)["hosts"][0]["status"] in ("error", "timeout")

    status = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert status["status"] == "clean"
    (said,) = told(status, "unheard by its controller")
    assert said.startswith("the post-extraction run begun here at "), said
    assert said.endswith("went on unheard by its controller (4 signals sent); "
                         "it ended clean"), said
    # Said once: the node answered for the token, which the controller then forgot.
    notes = tmp_path / "state" / "unheard.json"
    assert json.loads(notes.read_text())["hosts"] == {}
    assert told(cli("status", "-i", fleet.inventory_path, "--json").host("node01"),
                "unheard") == []
    # A teardown heard to its end leaves nothing to ask for.
    assert cli("run", "post-extraction", "-i", fleet.inventory_path,
               "--json").host("node01")["status"] == "clean"
    assert json.loads(notes.read_text())["hosts"] == {}


def stop_relay(pidfile: Path) -> None:
    """SIGKILL the relay by the PID it wrote, if it started and still runs."""
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


SLOW_FREE = """\
name: slow-free
description: stop the server, then give every GPU holder a long grace
stages:
  - {name: stop-server, type: signal, pattern: sglang.launch_server, grace: 1}
  - {name: free, type: gpu-holders, grace: 8}
verify: {max_used_mib: 0, timeout: 20}
"""


def test_a_status_says_a_teardown_that_lost_its_controller_is_still_at_work(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    server = fleet.spawn("node01", "stubborn", gpu=0, name="python3 -m sglang.launch_server")
    holder = fleet.spawn("node01", "stubborn", gpu=6)
    book = tmp_path / "slow-free.yaml"
    book.write_text(SLOW_FREE)
    proc = spawn_cli(tmp_path, "run", str(book), "-i", str(fleet.inventory_path), "--json")
    journal = fleet.node_path("node01", JOURNAL)
    kill_at_first_signal(proc, journal)
    # The server's SIGKILL, a second later, finds the controller gone; the holder's grace
    # (8 s) then runs with nobody watching.
    wait_for_record(journal, "gone", 30)

    during = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert during["status"] == "dirty"  # the holder still has GPU6
    (said,) = told(during)
    assert said.startswith("the slow-free run begun here at ") and said.endswith(
        "it is still at work"), said

    wait_for_record(journal, "done")
    assert alive(fleet, "node01", server + holder) == []
    after = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert after["status"] == "clean"
    (said,) = told(after)
    assert said.endswith("it ended clean"), said
    last = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert last["warnings"] == []


def test_the_next_teardown_tells_what_the_lone_one_did_and_keeps_its_own_journal_there(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    fleet.spawn("node01", "stubborn", gpu=0, name="python3 -m sglang.launch_server")
    proc = spawn_cli(tmp_path, "run", "post-extraction", "-i", str(fleet.inventory_path),
                     "-e", "grace=2", "--json")
    journal = fleet.node_path("node01", JOURNAL)
    kill_at_first_signal(proc, journal)
    wait_for_record(journal, "done")

    # A teardown, not a status, comes next: it tells the lone run's journal, then keeps its
    # own in the same place (and, its controller there to the end, empties it).
    holder = fleet.spawn("node01", "stubborn", gpu=3)
    res = cli("run", "post-extraction", "-i", fleet.inventory_path, "--json")
    host = res.host("node01")
    assert host["status"] == "clean" and alive(fleet, "node01", holder) == []
    (said,) = told(host)
    assert said.endswith("it ended clean"), said
    assert nothing_lost_left(fleet)
    assert not fleet.node_path("node01", "/journal").exists()
    status = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert status["warnings"] == []


SHELL_AFTER = """\
name: note-it
description: a command that writes on after its controller went away
stages:
  - name: note
    type: shell
    command: >-
      touch /tmp/note-started; until [ -e /tmp/note-go ]; do sleep 0.05; done;
      for i in $(seq 20); do echo still writing $i; sleep 0.05; done; echo done > /tmp/note-done
verify: {max_used_mib: 0, timeout: 5}
"""


def test_a_shell_stages_command_outlives_its_controller(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    book = tmp_path / "note-it.yaml"
    book.write_text(SHELL_AFTER)
    proc = spawn_cli(tmp_path, "run", str(book), "-i", str(fleet.inventory_path), "--json")
    started = fleet.node_path("node01", "/tmp/note-started")
    try:
        wait_for("the command's start", started.exists, 60)
    finally:
        proc.send_signal(signal.SIGKILL)  # our own child, by PID: no goodbye
        proc.communicate(timeout=30)
    # The command writes on once the controller is gone, for a second after sshd had a
    # second to close the stream it writes to. It used to die of that (SIGPIPE) at its
    # next `echo`; the teardown went on and called it exit 141.
    time.sleep(1)
    fleet.node_path("node01", "/tmp/note-go").touch()
    journal = fleet.node_path("node01", JOURNAL)
    wait_for_record(journal, "done", 30)
    assert fleet.node_path("node01", "/tmp/note-done").read_text() == "done\n"
    after = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    (said,) = told(after)
    assert said.endswith("it ended clean"), said


def test_an_exported_bundle_whose_tool_dies_finishes_alone_and_the_next_run_says_so(
    sim_fleet_factory: Callable[..., SimFleet], cli: Cli, tmp_path: Path
) -> None:
    fleet = sim_fleet_factory(1)
    server, holder = patched_and_busy(fleet)
    bundle = tmp_path / "fc.sh"
    res = cli("export", "script", "post-extraction", "-i", fleet.inventory_path,
              "-e", f"model_file={MODEL}", "-e", "grace=3")
    assert res.code == 0, res.err
    bundle.write_text(res.out)
    # The bundle as clush or `ssh host bash -p -s` runs it; the tool (our own ssh client,
    # by PID) dies once the server has had its SIGTERM. The bundle used to die at its next
    # write (SIGPIPE) and leave the rest undone.
    with bundle.open() as script:
        proc = subprocess.Popen(["ssh", "-F", str(fleet.ssh_config_path), "node01",
                                 "bash -p -s"], stdin=script, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # the records, as the tool prints them
            if "\tsignal\t" in line:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)

    model = fleet.node_path("node01", MODEL)
    wait_for("the model file put back", lambda: model.read_text() == "original\n", 60)
    wait_for_record(fleet.node_path("node01", JOURNAL), "done")
    assert alive(fleet, "node01", server + holder) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8
    # A status bundle, run by the same kind of tool, tells it (and takes the journal).
    status = cli("export", "script", "status", "-i", fleet.inventory_path)
    assert status.code == 0, status.err
    out = subprocess.run(["ssh", "-F", str(fleet.ssh_config_path), "node01", "bash -p -s"],
                         input=status.out, capture_output=True, text=True, timeout=120,
                         check=False)
    saved = tmp_path / "status.txt"
    saved.write_text(out.stdout + out.stderr)
    host = cli("report", "--json", saved).host("node01")
    (said,) = told(host)
    assert said.startswith("the post-extraction run begun here at ")
    assert said.endswith("it ended clean"), said
    again = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert again["warnings"] == []
