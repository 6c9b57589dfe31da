"""fleet.run_fleet's hook for the work a run needs only at its end (``started_all``):
hosts already run when it is called, so a Ctrl-C or an error there must not cost them."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from fleetclean import fleet
from fleetclean.models import Host
from fleetclean.transport import Options, ScriptOutput


class HeldSession:
    """A session whose hosts run until released; ``ran`` names those that ran to the end."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.running = threading.Semaphore(0)
        self.ran: list[str] = []

    def run(self, host: Host, pieces: tuple[str, ...], on_line: Callable[[str], None]
            ) -> ScriptOutput:
        self.running.release()
        assert self.release.wait(10)
        self.ran.append(host.name)
        return ScriptOutput(stdout="", exit_code=0, started=True)

    def abort(self) -> None:
        self.release.set()


def jobs(n: int) -> list[fleet.Job]:
    return [fleet.Job(Host(f"gpu{i:02d}", f"gpu{i:02d}"), ("true\n",)) for i in range(n)]


@pytest.mark.parametrize("fault", [KeyboardInterrupt, RuntimeError])
def test_a_ctrl_c_or_an_error_in_the_hook_leaves_the_running_hosts_run(
    fault: type[BaseException],
) -> None:
    session = HeldSession()
    called: list[int] = []

    def hook() -> None:
        called.append(1)
        for _ in range(3):  # every host started before the fault
            assert session.running.acquire(timeout=10)
        threading.Timer(0.2, session.release.set).start()
        raise fault("can't start new thread")

    result = fleet.run_fleet(jobs(3), playbook="status", opts=Options(), forks=3,
                             session=session, started_all=hook)  # type: ignore[arg-type]
    assert called == [1]
    assert sorted(session.ran) == ["gpu00", "gpu01", "gpu02"]
    assert sorted(h.host for h in result.hosts) == ["gpu00", "gpu01", "gpu02"]
    # A Ctrl-C there is the run's first: it waited for its hosts, and says it was cut.
    assert result.interrupted is (fault is KeyboardInterrupt)


def test_a_thread_that_cannot_start_leaves_every_host_with_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The 3rd worker thread fails to start (ulimit -u): the error escaped run_fleet with no
    # host's result at all; now the 2 running hosts finish and the rest say why not.
    from concurrent.futures import ThreadPoolExecutor
    session = HeldSession()
    session.release.set()
    real = ThreadPoolExecutor.submit
    count = {"n": 0}

    def submit(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        count["n"] += 1
        if count["n"] == 3:
            # As ThreadPoolExecutor does: the job is queued before its thread fails to
            # start, and a running worker may take it.
            real(self, fn, *args, **kwargs)
            raise RuntimeError("can't start new thread")
        return real(self, fn, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", submit)
    result = fleet.run_fleet(jobs(4), playbook="status", opts=Options(), forks=4,
                             session=session)  # type: ignore[arg-type]
    by = {h.host: h for h in result.hosts}
    assert sorted(session.ran) == ["gpu00", "gpu01"]  # (their empty output: an error too)
    assert "thread" not in (by["gpu00"].error or "") + (by["gpu01"].error or "")
    for name in ("gpu02", "gpu03"):
        assert by[name].status.value == "error"
        assert "could not start a thread" in (by[name].error or ""), by[name]
