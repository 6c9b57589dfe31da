"""The simulator's nvidia_uvm count (``sim/uvm_count.py``) in this process: its thread keeps
answering after an event that fails, and a holder reaped before it could be watched is not
counted. The count in a simulated node: tests/sim/test_uvm_count.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fleetclean.sim import uvm_count


def told(sock: Path) -> float:
    """Say a process opened the device; how long the answer took (seconds)."""
    started = time.monotonic()
    uvm_count.opened(str(sock))
    return time.monotonic() - started


def test_an_event_that_fails_leaves_the_count_kept_from_then_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvm_count, "holders", lambda: {os.getpid()})
    sock, refcnt = tmp_path / "uvm.sock", tmp_path / "refcnt"
    uvm_count.serve(str(sock), str(refcnt))
    assert refcnt.read_text() == "0\n"
    # Its file cannot be replaced (the new one's name taken by a directory): the event
    # fails, the caller is still answered at once, and the thread lives on.
    (tmp_path / "refcnt.new").mkdir()
    assert told(sock) < uvm_count.TIMEOUT_S / 2
    assert refcnt.read_text() == "0\n"
    (tmp_path / "refcnt.new").rmdir()
    time.sleep(uvm_count.RETRY_MS / 1000)  # the pause after a failed event
    assert told(sock) < uvm_count.TIMEOUT_S / 2
    assert refcnt.read_text() == "1\n"


def test_a_holder_reaped_before_its_pidfd_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reaped(pid: int) -> int:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(uvm_count, "holders", lambda: {os.getpid(), 4_000_000})
    real = os.pidfd_open
    monkeypatch.setattr(os, "pidfd_open",
                        lambda pid: reaped(pid) if pid == 4_000_000 else real(pid))
    sock, refcnt = tmp_path / "uvm.sock", tmp_path / "refcnt"
    uvm_count.serve(str(sock), str(refcnt))
    told(sock)
    assert refcnt.read_text() == "1\n"
