"""Which hosts had every GPU clean at their last status from this controller: a hint for
the GPU read a status script starts with (``render.early_reads``), never a result.

A host whose GPUs all read clean last time most likely still does: its status script asks
``--query-gpu`` first, as pdsh users do, and the compute apps only where some GPU turns out
to be in use; any other host (in use last time, faulty, unreachable, never seen) reads
``-q``, GPUs and processes in one call. A wrong hint costs one nvidia-smi call more on that
host (a host in use again) or the -q read's 1-2 ms (a host clean again), never a wrong
row: the script reads what is there either way. Only ``status`` notes hosts: a teardown
leaves its hosts clean for a moment, most often to start their servers again.

Kept in ``$FLEETCLEAN_STATE_DIR/last-clean.json`` (beside the run records), each host with
the time it was last seen clean; hosts not seen clean for 30 days are dropped. Concurrent
runs may lose each other's updates: each writes whole (rename), and a lost update only
costs the next status the cheaper read on those hosts.

>>> import os, tempfile
>>> from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> row = GpuRow(0, "GPU-1", "NVIDIA H200", 0, 143771)
>>> hosts = (HostResult("gpu01", HostStatus.CLEAN, gpus=(row,)),
...          HostResult("gpu02", HostStatus.DIRTY, gpus=(row,)))
>>> update(RunResult("status", 1.0, hosts))
>>> sorted(load())
['gpu01']
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

from fleetclean.models import HostResult, HostStatus, RunResult
from fleetclean.results.records import state_dir
from fleetclean.results.statefile import read_hosts, write_hosts

FILE = "last-clean.json"
# A host not seen clean for this long is dropped: it may have left the fleet.
KEEP_S = 30 * 24 * 3600


def path() -> Path:
    return state_dir() / FILE


def load() -> set[str]:
    """The hosts seen clean last; empty where the file is missing or unreadable (the
    hint is then that no host is known clean: every one reads -q, as without it)."""
    hosts = _read()
    return set(hosts)


def clean(host: HostResult) -> bool:
    """Every GPU of the host read clean: not only those an epilog or ``--gpus`` judged."""
    return host.status is HostStatus.CLEAN and host.judged_gpus is None and bool(host.gpus)


def update(result: RunResult, now: float | None = None) -> None:
    """Note the hosts of ``result`` that read clean, forget those that did not; the file is
    left as it is where nothing in it would change but the times of a few hosts (the
    hint's age matters only in days)."""
    now = time.time() if now is None else now
    before = _read()
    hosts = {h: t for h, t in before.items() if now - t < KEEP_S}
    for host in result.hosts:
        if clean(host):
            if host.host not in hosts or now - hosts[host.host] > 3600:
                hosts[host.host] = now
        else:
            hosts.pop(host.host, None)
    if hosts != before:
        write_hosts(FILE, hosts)


def _read() -> dict[str, float]:
    hosts: dict[str, float] = {}
    for host, t in read_hosts(FILE).items():
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            if math.isfinite(float(t)):
                hosts[str(host)] = float(t)
    return hosts
