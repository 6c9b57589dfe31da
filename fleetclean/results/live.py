"""Live progress on stderr while a run goes on; nothing when stderr is not a terminal.

At any fleet size the view stays a dozen lines: how many hosts are queued, connecting,
running (by stage) and done (by status), and the hosts that have been going longest, which
are the ones a person waits for; the hosts still connecting are counted by how far they got
(waiting for a startup slot, the SSH banner, the key exchange, authentication:
``transport.dialing``), and each of the longest says it. A small fleet also gets one line
per host.

Cheap at 1,000 hosts: an event only moves counters (O(1), under a lock); drawing happens
on rich's refresh thread a few times a second, and costs O(states + active hosts, which
``--forks`` bounds), never O(hosts). The oldest active hosts come first in an
insertion-ordered dict, so finding the slowest needs no sort.

Cheap to start: rich is imported only where the view is drawn. A run's view
(:meth:`LiveProgress.deferred`) counts from the first event but draws once every host is
handed out (:meth:`LiveProgress.begin`), from a thread of its own: rich's import (and the
console's) then fills the hosts' wait on the network instead of coming before the first
connection, where it cost a terminal's run 35-45 ms.

>>> import io
>>> from rich.console import Console
>>> from fleetclean.fleet import Event
>>> clock = iter([0.0, 1.0, 5.0, 6.0, 7.0]).__next__
>>> live = LiveProgress(Console(file=io.StringIO()), ["gpu01", "gpu02"], clock=clock)
>>> live(Event("gpu01", "start")); live(Event("gpu01", "stage", "stop-server"))
>>> live.counts()
{'queued': 1, 'running': 1}
>>> live.slowest()
[('gpu01', 4.0, 'stop-server')]
>>> live(Event("gpu02", "start", dialing=lambda: "authentication")); live.slowest()[1][2]
'connecting (authentication)'
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from fleetclean.models import HostStatus
from fleetclean.results.words import counted

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live
    from rich.text import Text

    from fleetclean.fleet import Event

_DONE_STYLE = {"clean": "green", "dirty": "yellow", "faulty": "bold magenta"}
_ORDER = [s.value for s in HostStatus]


@dataclass
class _Active:
    since: float
    stage: str = ""  # the stage it runs; "" while connecting
    dialing: Callable[[], str | None] | None = None  # how far it got, while connecting


def _connecting(dialing: Callable[[], str | None] | None) -> str:
    where = dialing() if dialing is not None else None
    return f"connecting ({where})" if where else "connecting"


class LiveProgress:
    """The fleet's event callback (thread-safe) and the live view drawn from it.

    ``clock`` is injectable so that tests can say how long a host has been running.
    """

    LINES_UP_TO = 16  # a line per host up to this many hosts
    SLOWEST = 5
    REFRESH_PER_SECOND = 4

    def __init__(
        self,
        console: Console | None,
        hosts: Iterable[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._console = console  # None: never drawn, or a deferred view's until begin()
        self._hosts = list(hosts)
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._queued = len(self._hosts)
        # host -> start time, stage ("" while connecting); insertion order = start order.
        self._active: dict[str, _Active] = {}
        self._stages: Counter[str] = Counter()  # running hosts by current stage
        self._done: Counter[str] = Counter()  # finished hosts by status
        self._state: dict[str, str] = {}  # only kept for the small-fleet per-host lines
        self._live: Live | None = None
        self._make_console: Callable[[], Console] | None = None
        self._then: Callable[[], None] | None = None
        # Guards _live and _closed: a deferred view's thread may start drawing as late as
        # the run's end, and must then not start at all (a view started after the stop
        # would stay on the screen, its cursor hidden).
        self._view_lock = threading.Lock()
        self._closed = False
        self._begun = False

    @classmethod
    def deferred(cls, make_console: Callable[[], Console], hosts: Iterable[str], *,
                 then: Callable[[], None] | None = None) -> LiveProgress:
        """A view that counts events from the start and draws from :meth:`begin` on, on a
        console ``make_console`` makes there (rich and the console imported off the way of
        the run's first connections); ``then`` runs on that thread after, drawn or not
        (not a terminal, the console failed, the run over first): the table's modules are
        imported there."""
        view = cls(None, hosts)  # its console is made in begin()
        view._make_console = make_console
        view._then = then
        return view

    def __enter__(self) -> LiveProgress:
        if self._make_console is None:
            self._draw()
        return self

    def begin(self) -> None:
        """A deferred view starts drawing, from a thread of its own (returns at once)."""
        if self._make_console is not None and not self._begun:
            self._begun = True
            threading.Thread(target=self._draw_made, daemon=True,
                             name="fleetclean-live").start()

    def _draw_made(self) -> None:
        # A view that cannot draw leaves the run as it is: the table still comes at its end.
        with contextlib.suppress(Exception):
            assert self._make_console is not None
            self._console = self._make_console()
            self._draw()
        if self._then is not None:
            with contextlib.suppress(Exception):
                self._then()

    def _draw(self) -> None:
        if self._console is not None and self._console.is_terminal:
            from rich.live import Live

            # rich redraws from its own thread at a bounded rate, calling render().
            live = Live(console=self._console, transient=True,
                        refresh_per_second=self.REFRESH_PER_SECOND,
                        get_renderable=self.render)
            with self._view_lock:
                if not self._closed:
                    live.start()
                    self._live = live

    def __exit__(self, *exc: object) -> None:
        # Not a join of a deferred view's thread (a Ctrl-C there would leave the view
        # drawing): once closed, that thread starts no view. Closed before the lock is
        # taken, so that a Ctrl-C while waiting for it still leaves the thread closed out.
        self._closed = True
        with self._view_lock:
            live, self._live = self._live, None
        if live is not None:
            live.stop()

    def __call__(self, event: Event) -> None:
        with self._lock:
            if event.kind == "start":
                self._start(event.host, event.dialing)
            elif event.kind == "stage":
                self._stage(event.host, event.stage)
            elif event.kind == "done" and event.result is not None:
                self._finish(event.host, event.result.status.value)

    def _start(self, host: str, dialing: Callable[[], str | None] | None) -> None:
        if host in self._active:
            return
        self._queued -= 1
        self._active[host] = _Active(self._clock(), dialing=dialing)
        self._state[host] = "connecting"

    def _stage(self, host: str, stage: str) -> None:
        entry = self._active.get(host)
        if entry is None:
            return
        if entry.stage:
            self._stages[entry.stage] -= 1
        entry.stage = stage
        self._stages[stage] += 1
        self._state[host] = stage

    def _finish(self, host: str, status: str) -> None:
        entry = self._active.pop(host, None)
        if entry is None:  # done without a start: count it as leaving the queue
            self._queued -= 1
        elif entry.stage:
            self._stages[entry.stage] -= 1
        self._done[status] += 1
        self._state[host] = status

    # --- what the view shows -----------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Hosts by phase: queued, connecting, running, done (zero phases left out)."""
        with self._lock:
            running = sum(self._stages.values())
            phases = {"queued": self._queued, "connecting": len(self._active) - running,
                      "running": running, "done": sum(self._done.values())}
        return {k: v for k, v in phases.items() if v}

    def slowest(self) -> list[tuple[str, float, str]]:
        """(host, seconds since it started, its stage or "connecting (how far)"), longest
        first."""
        now = self._clock()
        with self._lock:
            oldest = [(host, now - entry.since, entry.stage, entry.dialing)
                      for host, entry in islice(self._active.items(), self.SLOWEST)]
        # Asked outside the lock: it reads the host's connection, which its thread changes.
        return [(host, age, stage or _connecting(dialing)) for host, age, stage, dialing in oldest]

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.text import Text

        lines: list[RenderableType] = []
        small = len(self._hosts) <= self.LINES_UP_TO
        if small:
            with self._lock:
                states = {h: self._state.get(h, "queued") for h in self._hosts}
                connecting = {h: e.dialing for h, e in self._active.items() if not e.stage}
            lines += [Text.assemble((f"{h:<20}", "bold"), " ",
                                    _connecting(connecting[h]) if h in connecting else s)
                      for h, s in states.items()]
        lines += self._summary()
        slowest = [] if small else self.slowest()
        if slowest:
            lines.append(Text("longest running:", style="dim"))
            width = max(len(h) for h, _, _ in slowest)
            lines += [Text(f"  {h:<{width}}  {s:6.1f}s  {stage}") for h, s, stage in slowest]
        return Group(*lines)

    def _summary(self) -> list[Text]:
        """Three lines at most: done of all, then where the others are, then outcomes."""
        from rich.text import Text

        counts = self.counts()
        with self._lock:
            stages = [(s, n) for s, n in self._stages.items() if n]
            # At most --forks hosts are active: asking each connecting one stays bounded.
            dialing = [e.dialing for e in self._active.values() if not e.stage and e.dialing]
            done = sorted(((s, n) for s, n in self._done.items() if n),
                          key=lambda sn: _ORDER.index(sn[0]) if sn[0] in _ORDER else 99)
        elapsed = self._clock() - self._started
        lines = [Text.assemble(
            (f"{counts.get('done', 0)}/{counted(len(self._hosts), 'host')} done", "bold"),
            f" in {elapsed:.0f}s",
        )]
        where = [f"{phase} {counts[phase]}" for phase in ("queued", "connecting")
                 if counts.get(phase)]
        steps = Counter(step for step in (probe() for probe in dialing) if step)
        if steps and where and where[-1].startswith("connecting"):
            where[-1] += " (" + ", ".join(f"{s} {n}" for s, n in steps.most_common()) + ")"
        if stages:
            where.append(f"running {counts['running']} (" +
                         ", ".join(f"{s} {n}" for s, n in stages) + ")")
        if where:
            lines.append(Text("  " + " · ".join(where)))
        if done:
            outcome = Text("  done: ")
            for i, (status, n) in enumerate(done):
                outcome.append(" · " if i else "")
                outcome.append(f"{status} {n}", style=_DONE_STYLE.get(status, "bold red"))
            lines.append(outcome)
        return lines
