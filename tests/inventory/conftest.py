"""Shared fixtures: no test may read the developer's own ~/.ssh/config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _no_user_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCLEAN_SSH_CONFIG", "")


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """write("lab.yml", text) -> the path of a new file holding text."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write
