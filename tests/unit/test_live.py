"""The live view at 1,000 hosts: counts by state and the longest-running hosts, a dozen
lines whatever the fleet size; fed synthetic fleet events (no SSH)."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable

import pytest
from rich.console import Console

from fleetclean.fleet import Event
from fleetclean.models import HostResult, HostStatus
from fleetclean.results.live import LiveProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def names(n: int) -> list[str]:
    return [f"node{i:04d}" for i in range(1, n + 1)]


def done(host: str, status: HostStatus) -> Event:
    return Event(host, "done", result=HostResult(host, status))


def busy_fleet(n: int) -> tuple[LiveProgress, Clock]:
    """n hosts: 40% queued, then for every 10 started: 1 connecting, 1 in stop-server,
    2 in verify, 6 done (4 clean, 1 dirty, 1 unreachable)."""
    clock = Clock()
    hosts = names(n)
    live = LiveProgress(Console(file=io.StringIO()), hosts, clock=clock)
    started = hosts[: n * 6 // 10]
    for i, host in enumerate(started):
        clock.now = i * 0.01
        live(Event(host, "start"))
        kind = i % 10
        if kind >= 1:
            live(Event(host, "stage", "stop-server"))
        if kind >= 2:
            live(Event(host, "stage", "verify"))
        if kind >= 4:
            status = {4: HostStatus.DIRTY, 5: HostStatus.UNREACHABLE}.get(kind, HostStatus.CLEAN)
            live(done(host, status))
    clock.now = 100.0
    return live, clock


def shown(live: LiveProgress, width: int = 100) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), no_color=True)
    console.print(live.render())
    return console.export_text().splitlines()


def test_counts_by_state_are_right_at_1000_hosts() -> None:
    live, _ = busy_fleet(1000)
    assert live.counts() == {"queued": 400, "connecting": 60, "running": 180, "done": 360}
    text = "\n".join(shown(live))
    assert "360/1000 hosts done" in text
    assert "queued 400 · connecting 60 · running 180 (stop-server 60, verify 120)" in text
    assert "done: clean 240 · dirty 60 · unreachable 60" in text


def test_view_of_1000_hosts_is_a_dozen_lines_not_a_thousand() -> None:
    small, _ = busy_fleet(100)
    large, _ = busy_fleet(1000)
    assert len(shown(large)) <= 12
    assert len(shown(large)) == len(shown(small))  # the height does not grow with the fleet
    assert len(shown(large, width=60)) <= 16  # wraps, still bounded, on a narrow terminal


def test_longest_running_hosts_are_shown_with_elapsed_time_and_stage() -> None:
    live, _ = busy_fleet(1000)
    # node0001 (i=0) is still connecting since t=0; node0002 in stop-server since t=0.01.
    assert live.slowest()[:3] == [("node0001", 100.0, "connecting"),
                                  ("node0002", pytest.approx(99.99), "stop-server"),
                                  ("node0003", pytest.approx(99.98), "verify")]
    assert len(live.slowest()) == LiveProgress.SLOWEST
    lines = shown(live)
    at = lines.index("longest running:")
    assert lines[at + 1].split() == ["node0001", "100.0s", "connecting"]
    assert len(lines) - at - 1 == LiveProgress.SLOWEST
    # Once the oldest finishes, the next oldest leads.
    live(done("node0001", HostStatus.CLEAN))
    assert live.slowest()[0][0] == "node0002"
    assert live.counts()["done"] == 361


def test_events_only_move_counters_drawing_is_left_to_the_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = LiveProgress(Console(file=io.StringIO()), names(10), clock=Clock())

    def boom() -> None:
        raise AssertionError("an event must not draw the view")

    monkeypatch.setattr(live, "render", boom)
    for host in names(10):
        live(Event(host, "start"))
        live(Event(host, "stage", "verify"))
        live(done(host, HostStatus.CLEAN))
    assert live.counts()["done"] == 10


def test_every_host_done_leaves_nothing_running() -> None:
    clock = Clock()
    live = LiveProgress(Console(file=io.StringIO()), names(1000), clock=clock)
    for host in names(1000):
        live(Event(host, "start"))
        live(Event(host, "stage", "verify"))
        live(done(host, HostStatus.CLEAN))
    assert live.counts() == {"done": 1000}
    assert live.slowest() == []
    assert "longest running:" not in shown(live)


def test_a_small_fleet_also_gets_a_line_per_host() -> None:
    clock = Clock()
    live = LiveProgress(Console(file=io.StringIO()), ["gpu01", "gpu02", "gpu03"], clock=clock)
    live(Event("gpu01", "start"))
    live(Event("gpu01", "stage", "stop-server"))
    live(Event("gpu02", "start"))
    lines = [" ".join(line.split()) for line in shown(live)]
    assert "gpu01 stop-server" in lines
    assert "gpu02 connecting" in lines
    assert "gpu03 queued" in lines


def test_nothing_is_drawn_when_stderr_is_not_a_terminal() -> None:
    out = io.StringIO()
    with LiveProgress(Console(file=out), names(50)) as live:
        for host in names(50):
            live(Event(host, "start"))
            live(done(host, HostStatus.CLEAN))
    assert out.getvalue() == ""


@pytest.mark.parametrize("n", [2, 100])
def test_a_host_still_connecting_says_how_far_it_got(n: int) -> None:
    """One line per host in a small fleet, the longest-running lines in a big one."""
    hosts = names(n)
    live = LiveProgress(Console(file=io.StringIO()), hosts, clock=Clock())
    live(Event(hosts[0], "start", dialing=lambda: "authentication"))
    live(Event(hosts[1], "start"))  # nothing known of its connection (a local host)
    lines = shown(live)
    assert any(line.startswith(hosts[0]) and line.endswith("connecting (authentication)")
               for line in (x.strip() for x in lines)), lines
    assert any(line.startswith(hosts[1]) and line.endswith("connecting")
               for line in (x.strip() for x in lines)), lines


def saying(step: str | None) -> Callable[[], str | None]:
    return lambda: step


def test_the_hosts_still_connecting_are_counted_by_how_far_they_got() -> None:
    hosts = names(1000)
    live = LiveProgress(Console(file=io.StringIO()), hosts, clock=Clock())
    steps = ["authentication", "waiting for a startup slot", "authentication", None]
    for host, step in zip(hosts[:4], steps, strict=True):
        live(Event(host, "start", dialing=saying(step)))
    live(Event(hosts[4], "start"))
    live(Event(hosts[4], "stage", "verify"))
    lines = [line.strip() for line in shown(live)]
    assert ("queued 995 · connecting 4 (authentication 2, waiting for a startup slot 1) · "
            "running 1 (verify 1)") in lines, lines


def terminal(out: io.StringIO) -> Console:
    return Console(file=out, force_terminal=True, width=80)


def test_a_deferred_view_counts_from_the_start_and_draws_from_begin_on() -> None:
    out = io.StringIO()
    drawn = threading.Event()
    with LiveProgress.deferred(lambda: terminal(out), names(2), then=drawn.set) as live:
        live(Event("node0001", "start"))
        live(done("node0001", HostStatus.CLEAN))
        assert out.getvalue() == ""  # not drawn before begin, yet counted
        live.begin()
        assert drawn.wait(10)
    assert live.counts() == {"queued": 1, "done": 1}
    assert "1/2 hosts done" in out.getvalue()


def test_a_view_closed_before_its_thread_could_draw_never_draws() -> None:
    """A run over before rich was imported: the late thread starts no view, which would
    stay on the screen with the cursor hidden."""
    out = io.StringIO()
    release, finished = threading.Event(), threading.Event()

    def late_console() -> Console:
        release.wait(10)
        return terminal(out)

    with LiveProgress.deferred(late_console, names(2), then=finished.set) as live:
        live.begin()
    release.set()
    assert finished.wait(10)
    assert out.getvalue() == ""
