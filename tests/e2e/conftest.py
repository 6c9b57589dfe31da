"""End-to-end helpers: the real CLI, in-process, against simulated nodes over real SSH."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetclean.cli import Env, main


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def host(self, name: str) -> dict[str, Any]:
        hosts: list[dict[str, Any]] = self.json()["hosts"]
        return next(h for h in hosts if h["host"] == name)


Cli = Callable[..., CliResult]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli("run", "post-extraction", "-i", inv, "--json")`` -> CliResult."""
    monkeypatch.setenv("FLEETCLEAN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*argv: str | Path) -> CliResult:
        out, err = io.StringIO(), io.StringIO()
        env = Env(stdout=out, stderr=err, environ={"NO_COLOR": "1"})
        code = main([str(a) for a in argv], env)
        return CliResult(code, out.getvalue(), err.getvalue())

    return run
