"""Variable precedence, -e parsing, strict substitution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetclean.engine.playbook import load_playbook
from fleetclean.engine.substitute import substitute
from fleetclean.engine.variables import parse_extra_vars, resolve
from fleetclean.errors import VariableError


def test_precedence_defaults_then_inventory_then_extra() -> None:
    pb = load_playbook("post-extraction")
    v = resolve(pb, {"grace": 3, "dump_dir": "/dev/shm/a"}, {"grace": "7"}).variables
    assert v["grace"] == "7"
    assert v["dump_dir"] == "/dev/shm/a"
    assert v["server_pattern"] == "sglang.launch_server"
    assert v["lock_wait"] == 5  # built-in default


def test_extra_vars_forms(tmp_path: Path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text("grace: 4\nprotect: [jupyter]\n")
    got = parse_extra_vars(["grace=1", f"@{f}", json.dumps({"max_used_mib": 10}),
                            "model_file=/m/a=b.py"])
    assert got == {"grace": 4, "protect": ["jupyter"], "max_used_mib": 10,
                   "model_file": "/m/a=b.py"}


@pytest.mark.parametrize(("item", "message"), [
    ("grace", "expected KEY=VALUE, @FILE.yaml or a JSON object"),
    ("{not json", "invalid JSON"),
    ("[1]", "expected KEY=VALUE"),
    ("bad-name=1", "is not an identifier"),
    ("@/nonexistent/vars.yaml", "cannot read"),
])
def test_extra_vars_errors(item: str, message: str) -> None:
    with pytest.raises(VariableError, match=message):
        parse_extra_vars([item])


def test_whole_reference_keeps_type_and_partial_is_text() -> None:
    assert substitute("{{ n }}", {"n": 10}, None) == 10
    assert substitute("x{{n}}y", {"n": 10}, None) == "x10y"
    assert substitute(["{{ a }}", "b"], {"a": "A"}, None) == ["A", "b"]


@pytest.mark.parametrize(("text", "message"), [
    ("{{ a | default(1) }}", "unsupported expression"),
    ("{{ a }", "unbalanced"),
    ("{{ missing }}", "undefined variable 'missing'"),
])
def test_strict_substitution(text: str, message: str) -> None:
    with pytest.raises(VariableError, match=message):
        substitute(text, {"a": 1}, None)


def test_protect_accepts_list_or_comma_string_and_keeps_defaults() -> None:
    pb = load_playbook("pre-restart")
    r = resolve(pb, {}, {"protect": "jupyter, tensorboard"})
    assert r.protect[-2:] == ("jupyter", "tensorboard") and "sshd" in r.protect
    r = resolve(pb, {"protect": ["agent"]}, {})
    assert "agent" in r.protect and "nvidia-persistenced" in r.protect
