"""What the run records say about each host's last run: when it ended and how many GPUs
it showed. The defaults of the ``faulty`` checks that need a host's past (see
:mod:`fleetclean.results.health`).

>>> import os, tempfile
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> last_seen(["gpu01"])
{}
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import calendar
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetclean.models import Host, HostResult, RunResult
from fleetclean.results.health import expected_from, judge
from fleetclean.results.records import list_records, seen_path, seen_summary

# Records read back at most: enough for any host of a fleet that runs in turns, and a
# bound on the start-up cost of a controller with years of records (a 64-host record takes
# about a millisecond to parse). Once every host is found, a few more records are read for
# the GPU count, then no more: a fleet that runs as one costs a handful.
_LOOK_BACK = 200
_AFTER_ALL_FOUND = 4


@dataclass(frozen=True)
class Seen:
    ended: float  # epoch seconds the host's last recorded run ended
    gpus: int  # the most GPUs one of its recorded runs showed (0: none)


def last_seen(names: Iterable[str]) -> dict[str, Seen]:
    """``{host: Seen}`` from the newest run records; hosts never recorded are missing.

    ``gpus`` is the most any recent run showed, not the last one's: a run that already
    saw a GPU missing must not make the smaller count the norm.
    """
    want = set(names)
    ended: dict[str, float] = {}
    gpus: dict[str, int] = {}
    extra = 0
    for path in reversed(list_records()[-_LOOK_BACK:]):
        if len(ended) == len(want):
            extra += 1
            if extra > _AFTER_ALL_FOUND:
                break
        try:
            _fold(_summary(path), want, ended, gpus)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
    return {h: Seen(ended[h], gpus.get(h, 0)) for h in ended}


def _summary(record: Path) -> Mapping[str, Any]:
    """The record's summary (``records.seen_summary``): from the small file beside it,
    or, for a record written before those existed, from the record itself."""
    try:
        summary: Mapping[str, Any] = json.loads(seen_path(record).read_text())
        return summary
    except (OSError, ValueError):
        return seen_summary(json.loads(record.read_text()))


def _fold(summary: Mapping[str, Any], want: set[str], ended: dict[str, float],
          gpus: dict[str, int]) -> None:
    hosts = summary["hosts"]
    if not hosts:
        return  # started, never finished (or the run in progress): nothing seen
    start = calendar.timegm(time.strptime(summary["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    for name, (duration, count) in hosts.items():
        if name not in want or not count:
            continue
        ended.setdefault(name, start + float(duration))
        gpus[name] = max(gpus.get(name, 0), int(count))


class HistoryJudge:
    """A host's result judged against its past (:func:`health.judge`): an inventory
    ``expected_gpus`` wins over the count its records show. The records are read once, at
    :meth:`load` or the first host judged, from any thread: a run loads them while its
    hosts run, and its live view counts each host as the table will show it (a hardware
    Xid since its last run: faulty, not clean). A run that another controller finishes
    meanwhile is not this run's "last run" of its hosts: the two ran at once."""

    def __init__(self, hosts: Iterable[Host]) -> None:
        self._hosts = {h.name: h for h in hosts}
        self._seen: dict[str, Seen] | None = None
        self._lock = threading.Lock()

    def load(self) -> dict[str, Seen]:
        with self._lock:
            if self._seen is None:
                self._seen = last_seen(self._hosts)
            return self._seen

    def __call__(self, h: HostResult) -> HostResult:
        past = self.load().get(h.host)
        host = self._hosts.get(h.host)
        expected = expected_from(host.vars.get("expected_gpus")) if host else None
        if expected is None and past is not None and past.gpus:
            expected = past.gpus
        return judge(h, expected_gpus=expected, since_epoch=past.ended if past else None)


def apply_history(result: RunResult, hosts: Iterable[Host]) -> RunResult:
    """``result`` with each host judged against its past (:class:`HistoryJudge`)."""
    return judged_by(result, HistoryJudge(hosts))


def judged_by(result: RunResult, judged: Callable[[HostResult], HostResult]) -> RunResult:
    """``result`` with every host passed through ``judged``."""
    return replace(result, hosts=tuple(judged(h) for h in result.hosts))
