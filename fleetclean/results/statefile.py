"""The controller's small hint files beside the run records (``last-clean.json``,
``last-named.json``, ``unheard.json``): each one JSON object, ``{"hosts": {host: value}}``,
read and written whole.

A hint is never a result: a file that is missing, unreadable or damaged reads as no hosts,
and one that cannot be written costs only what the hint would have saved. Concurrent runs
may lose each other's updates: each writes whole, under a name of its own process, then
renames, so that a reader never sees half a file.

>>> import os, tempfile
>>> os.environ["FLEETCLEAN_STATE_DIR"] = tempfile.mkdtemp()
>>> read_hosts("x.json")
{}
>>> write_hosts("x.json", {"gpu01": 1})
>>> read_hosts("x.json")
{'gpu01': 1}
>>> update_hosts("x.json", lambda hosts: {**hosts, "gpu02": 2})
>>> sorted(read_hosts("x.json"))
['gpu01', 'gpu02']
>>> del os.environ["FLEETCLEAN_STATE_DIR"]
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from fleetclean.results.records import state_dir


def read_hosts(name: str) -> dict[str, Any]:
    """The file's hosts; empty where it is missing or not what it should be."""
    try:
        hosts = json.loads((state_dir() / name).read_text())["hosts"]
        return dict(hosts) if isinstance(hosts, dict) else {}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return {}  # json's parser recurses: a file of nested brackets must not fail a run


def write_hosts(name: str, hosts: Mapping[str, Any]) -> None:
    """Write the file whole (then rename); a state directory that cannot be written is
    no reason to fail a run."""
    target = state_dir() / name
    tmp = target.with_name(f".{name}.{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"hosts": dict(hosts)}, sort_keys=True,
                                  separators=(",", ":")))
        tmp.replace(target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def update_hosts(name: str, change: Callable[[dict[str, Any]], Mapping[str, Any]]) -> None:
    """Read, change and write the file under a lock of its own (``.NAME.lock``), so that
    two runs that update it at once both count: for a file whose lost update costs more
    than a hint. Where no lock can be had (a state directory that cannot be written, a file
    system without locks) it is done unlocked: a run is never failed for a hint file."""
    lock = state_dir() / f".{name}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        fd = -1
    try:
        if fd >= 0:
            # No locks there (NFS without lockd: ENOLCK): done unlocked.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        before = read_hosts(name)
        after = dict(change(dict(before)))
        if after != before:
            write_hosts(name, after)
    finally:
        if fd >= 0:
            os.close(fd)  # and the lock with it
