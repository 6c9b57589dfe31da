"""Live progress on stderr while a run goes on; nothing when stderr is not a terminal."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

if TYPE_CHECKING:
    from fleetclean.fleet import Event


class LiveProgress:
    """Live view while a run goes on: a line per host for small fleets, a bar beyond.

    Used as the fleet's event callback (thread-safe). Shows nothing when the console is
    not a terminal.
    """

    LINES_UP_TO = 16

    def __init__(self, console: Console, hosts: Iterable[str]) -> None:
        self._console = console
        self._hosts = list(hosts)
        self._state: dict[str, str] = {h: "waiting" for h in self._hosts}
        self._lock = threading.Lock()
        self._enabled = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("hosts", total=len(self._hosts))
        self._live = Live(console=console, refresh_per_second=8, transient=True)

    def __enter__(self) -> LiveProgress:
        if self._enabled:
            self._live.start()
            self._live.update(self._render())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            self._live.stop()

    def __call__(self, event: Event) -> None:
        with self._lock:
            if event.kind == "start":
                self._state[event.host] = "connecting"
            elif event.kind == "stage":
                self._state[event.host] = event.stage
            elif event.kind == "done" and event.result is not None:
                self._state[event.host] = event.result.status.value
                self._progress.advance(self._task)
            if self._enabled:
                self._live.update(self._render())

    def _render(self) -> RenderableType:
        counts: dict[str, int] = defaultdict(int)
        for state in self._state.values():
            counts[state] += 1
        desc = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        self._progress.update(self._task, description=desc)
        if len(self._hosts) > self.LINES_UP_TO:
            return self._progress
        lines = [Text.assemble((f"{h:<20}", "bold"), " ", self._state[h]) for h in self._hosts]
        return Group(*lines, self._progress)
