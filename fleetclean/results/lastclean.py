"""Which hosts had every GPU clean at their last status from this controller: a hint for
the status script of each (``render.Renderer.pieces``), never a result.

Which GPU read a status script starts with, the node decides (``render.early_reads``):
``--query-gpu`` where its kernel counts no open /dev/nvidia-uvm (no CUDA process), -q
where it counts some. A host whose GPUs all read clean last time most likely has none
again: bash parses the -q read's definitions only where it does, with the busy tier's
(``lazy.tiers``), and where the node's count cannot be read (a sysfs that hides the
modules) it reads the query, any other host -q. A host never seen parses both reads' as
it reads the script. A wrong hint costs a parse, or a second nvidia-smi call, never a
wrong row. Only ``status`` notes hosts: a teardown leaves its hosts
clean for a moment, most often to start their servers again.

Kept in ``$FLEETCLEAN_STATE_DIR/last-clean.json`` (beside the run records), each host with
the time it was last seen clean; hosts not seen clean for 30 days are dropped. Concurrent
runs may lose each other's updates: each writes whole (rename), and a lost update only
costs the next status on those hosts that parse.

A host whose last status named processes most likely runs them still (a serving fleet's
servers run for days): its next status reads those processes, with their owners, while
its -q read runs (verify.sh: fc_verify_prep), so that naming them costs no wall time after
the read. Each is named by its PID and start time (clock ticks after the node's boot), which
together name one process for its whole life: one that ended, or any after a reboot, costs
a read of its stat, never a read of another process; and the read alone says who uses a
GPU. Kept in ``last-named.json``, each host with the time and its processes (at most
:data:`MAX_NAMED`); a host whose status named none, or did not end, is dropped.

>>> import os, tempfile
>>> from fleetclean.models import GpuRow, HostResult, HostStatus, RunResult
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> row = GpuRow(0, "GPU-1", "NVIDIA H200", 0, 143771)
>>> hosts = (HostResult("gpu01", HostStatus.CLEAN, gpus=(row,)),
...          HostResult("gpu02", HostStatus.DIRTY, gpus=(row,)))
>>> update(RunResult("status", 1.0, hosts))
>>> sorted(load())
['gpu01']
>>> from fleetclean.models import GpuProcess
>>> apps = tuple(GpuProcess(pid, "python", 9, "GPU-1", start=start)
...              for pid, start in ((812, 5001), (77, 4000), (812, 5001), (90, None)))
>>> update(RunResult("status", 1.0, (HostResult("gpu02", HostStatus.DIRTY, gpus=(row,),
...                                             processes=apps, ended=True),)))
>>> named()
{'gpu02': '77:4000 812:5001'}
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
NAMED_FILE = "last-named.json"
# A host not seen clean (or naming processes) for this long is dropped: it may have left
# the fleet.
KEEP_S = 30 * 24 * 3600
# The processes kept a host: an 8-GPU node's servers hold a few GPU processes each; the script
# stops reading them as soon as its GPU read is done, so more would only go unread.
MAX_NAMED = 32


def path() -> Path:
    return state_dir() / FILE


def load() -> set[str]:
    """The hosts seen clean last; empty where the file is missing or unreadable (the
    hint is then that no host is known clean: each parses both reads' code, as without
    it)."""
    hosts = _read()
    return set(hosts)


def clean(host: HostResult) -> bool:
    """Every GPU of the host read clean: not only those an epilog or ``--gpus`` judged."""
    return host.status is HostStatus.CLEAN and host.judged_gpus is None and bool(host.gpus)


def named() -> dict[str, str]:
    """Each host's processes its last status named, as ``FC_VHINT`` takes them
    ("PID:START PID:START ..."), where it named any; empty where the file is missing or
    unreadable."""
    return {host: hint(procs) for host, (_, procs) in _read_named().items()}


Named = tuple[tuple[int, int], ...]  # (PID, start time), by PID


def hint(procs: Named) -> str:
    """``FC_VHINT``'s words for ``procs``: "PID:START PID:START ...".

    >>> hint(((77, 4000), (812, 5001)))
    '77:4000 812:5001'
    """
    return " ".join(f"{pid}:{start}" for pid, start in procs)


def processes_named(host: HostResult) -> Named:
    """The GPU processes a host's status named, heard to its end (none where it did not
    end: a status cut off while naming a process stuck in the kernel must not read it first
    next time), each with its start time (a process the node could not read, in another PID
    namespace, has none: never read early), at most :data:`MAX_NAMED`."""
    if not host.ended or clean(host):
        return ()
    procs = sorted({(p.pid, p.start) for p in host.processes
                    if not p.device_only and p.pid > 1 and p.start is not None})
    return tuple(procs[:MAX_NAMED])


def update(result: RunResult, now: float | None = None) -> None:
    """Note the hosts of ``result`` that read clean, forget those that did not, and each
    host's processes named (:func:`processes_named`); a file is left as it is where nothing in it
    would change but the times of a few hosts (the hint's age matters only in days)."""
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
    before_named = _read_named()
    kept = {h: v for h, v in before_named.items() if now - v[0] < KEEP_S}
    for host in result.hosts:
        procs = processes_named(host)
        if not procs:
            kept.pop(host.host, None)
        elif host.host not in kept or kept[host.host][1] != procs or \
                now - kept[host.host][0] > 3600:
            kept[host.host] = (now, procs)
    if kept != before_named:
        write_hosts(NAMED_FILE, {h: [t, [list(p) for p in procs]]
                                 for h, (t, procs) in kept.items()})


def _read_named() -> dict[str, tuple[float, Named]]:
    hosts: dict[str, tuple[float, Named]] = {}
    for host, value in read_hosts(NAMED_FILE).items():
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            t, procs = value
            t = float(t)
            # Only what the script takes for a PID and a start time: a damaged file names
            # nothing else.
            if math.isfinite(t) and isinstance(procs, list) and procs and all(
                    isinstance(p, list) and len(p) == 2 and type(p[0]) is int
                    and type(p[1]) is int and 1 < p[0] < 2**22 and 0 <= p[1] < 2**63
                    for p in procs[:MAX_NAMED]):
                hosts[str(host)] = (t, tuple((p[0], p[1]) for p in procs[:MAX_NAMED]))
    return hosts


def _read() -> dict[str, float]:
    hosts: dict[str, float] = {}
    for host, t in read_hosts(FILE).items():
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            if math.isfinite(float(t)):
                hosts[str(host)] = float(t)
    return hosts
