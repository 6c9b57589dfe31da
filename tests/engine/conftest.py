"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def sleeper() -> Iterator[int]:
    """The PID of a ``sleep 60`` this test started, the one process it may signal."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
