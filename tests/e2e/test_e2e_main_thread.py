"""A process whose main thread called ``pthread_exit`` while its other threads work on,
over SSH on a simulated node (``sim spawn NODE pthread-exit``): its leader is a zombie
(``ps``: ``Zl``, no command line, an empty /proc/PID/fd) and the process is alive, holding
its GPU in its living thread, listed by nvidia-smi. It was taken for a process in its exit:
named "(exiting)", never signalled, and a teardown waited out its verify_timeout to end
dirty. Its thread waiting in the driver (``thread="driver"``), it is alive until killed and
stuck after (item 58), as before. One fleet serves the module; each test leaves its node
idle.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from simhelp import Cli, alive

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim




def stage(host: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in host["stages"] if s["name"] == name)


def used(host: dict[str, Any]) -> list[int]:
    return [g["memory_used_mib"] for g in host["gpus"]]


def test_status_names_it_as_its_gpus_holder(fleet: SimFleet, cli: Cli) -> None:
    (worker,) = fleet.spawn("node01", "pthread-exit", gpu=5, mib=8192)
    assert fleet.run_in("node01", ["ps", "-o", "stat=", "-p", str(worker)]).stdout == "Zl\n"
    host = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert (host["status"], used(host)) == ("dirty", [0, 0, 0, 0, 0, 8192, 0, 0])
    (proc,) = host["gpus"][5]["processes"]
    assert (proc["pid"], proc["cmdline"], proc["used_mib"], proc["stuck"]) == (
        worker, "python3 thread_worker.py --gpu 5", 8192, False)
    assert host["error"] == (
        f"GPU5 8192 MiB; held by {worker} python3 thread_worker.py --gpu 5 (root; GPU5)")


def test_a_teardown_signals_it_and_the_host_ends_clean(fleet: SimFleet, cli: Cli) -> None:
    # One stopped by its name (a server's, matched by the signal stage), one as a GPU
    # holder (the gpu-holders stage): each the group of a zombie leader, reached by its PID.
    (server,) = fleet.spawn("node01", "pthread-exit", gpu=1, mib=4096,
                            name="python3 -m sglang.launch_server --tp 1")
    (worker,) = fleet.spawn("node01", "pthread-exit", gpu=5, mib=8192)
    check = cli("run", "post-extraction", "-i", fleet.inventory_path, "--check")
    assert f"would send TERM to {worker} (python3 thread_worker.py --gpu 5)" in check.out
    assert f"would send TERM to {server} (python3 -m sglang.launch_server --tp 1)" in check.out
    started = time.monotonic()
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "verify_timeout=20",
               "--json")
    assert time.monotonic() - started < 15  # not the deadline
    host = done.host("node01")
    assert (done.code, host["status"], host["error"]) == (0, "clean", None)
    assert used(host) == [0] * 8
    assert [(s["pid"], s["signal"], s["cmdline"]) for s in host["signalled"]] == [
        (server, "TERM", "python3 -m sglang.launch_server --tp 1"),
        (worker, "TERM", "python3 thread_worker.py --gpu 5")]
    assert (stage(host, "stop-server")["matched"], stage(host, "stop-server")["remaining"]) == (
        1, 0)
    holders = stage(host, "kill-gpu-holders")
    assert (holders["matched"], holders["signalled"], holders["remaining"]) == (1, 1, 0)
    assert alive(fleet, "node01", [server, worker]) == []
    assert fleet.gpu_used_mib("node01") == [0] * 8


def test_its_thread_waiting_in_the_driver_is_alive_then_stuck_once_killed(
    fleet: SimFleet, cli: Cli
) -> None:
    (worker,) = fleet.spawn("node01", "pthread-exit", gpu=2, mib=8192, thread="driver")
    started = time.monotonic()
    done = cli("run", "post-extraction", "-i", fleet.inventory_path, "-e", "grace=0.5",
               "-e", "verify_timeout=60", "--json")
    assert time.monotonic() - started < 40  # not the deadline
    host = done.host("node01")
    assert (done.code, host["status"], host["verify"]) == (1, "dirty", {"rule": "stuck"})
    assert [(s["pid"], s["signal"]) for s in host["signalled"]] == [(worker, "TERM")]
    assert used(host) == [0, 0, 8192, 0, 0, 0, 0, 0]
    assert host["stuck"] == [{"pid": worker, "cmdline": "python3 thread_worker.py --gpu 2"}]
    assert (f"held by {worker} python3 thread_worker.py --gpu 2 (root; GPU2; stuck in the "
            "kernel (state D) since SIGKILL: reboot or reset needed)") in host["error"]
    fleet.set_fault("node01", "unstick")  # the driver lets go: the last thread ends
    deadline = time.monotonic() + 10
    while fleet.gpu_used_mib("node01")[2] and time.monotonic() < deadline:
        time.sleep(0.05)
    again = cli("status", "-i", fleet.inventory_path, "--json").host("node01")
    assert (again["status"], used(again)) == ("clean", [0] * 8)
