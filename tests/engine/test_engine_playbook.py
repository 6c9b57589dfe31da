"""Playbook loading: built-ins, and every mistake reported with file:line:column."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from fleetclean.engine.playbook import list_playbooks, load_playbook
from fleetclean.engine.variables import parse_extra_vars, resolve
from fleetclean.errors import PlaybookError, VariableError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pb.yaml"
    path.write_text(text)
    return str(path)


def test_builtins_are_listed_with_descriptions() -> None:
    names = [n for n, d in list_playbooks() if d]
    assert names == ["free-gpus", "post-extraction", "pre-restart", "status"]


@pytest.mark.parametrize("name", ["free-gpus", "post-extraction", "pre-restart", "status"])
def test_builtin_copies_in_playbooks_dir_are_identical(name: str) -> None:
    shipped = ROOT / "fleetclean" / "engine" / "playbooks" / f"{name}.yaml"
    assert (ROOT / "playbooks" / f"{name}.yaml").read_text() == shipped.read_text()


def test_post_extraction_has_the_design_variables() -> None:
    pb = load_playbook("post-extraction")
    for var in ("server_pattern", "worker_pattern", "grace", "model_file", "backup_suffix",
                "dump_dir", "max_used_mib", "verify_timeout", "protect", "reset_leaked"):
        assert var in pb.vars
    assert pb.vars["max_used_mib"] == 0 and pb.vars["reset_leaked"] is False
    assert [s.type for s in pb.stages] == [
        "guard", "signal", "signal", "gpu-holders", "gpu-reset", "restore", "remove"]


def test_playbook_by_path(tmp_path: Path) -> None:
    path = write(tmp_path, "name: mine\nstages:\n  - {name: s, type: signal, pattern: foo}\n")
    pb = load_playbook(path)
    assert pb.name == "mine" and pb.stages[0].options["grace"] == 10 and pb.verify is None


def test_unknown_builtin_suggests_the_close_one() -> None:
    with pytest.raises(PlaybookError) as exc:
        load_playbook("post-extractoin")
    assert "did you mean 'post-extraction'?" in str(exc.value)


def test_unknown_stage_key_names_line_column_and_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstages:\n  - name: stop\n    type: signal\n"
                           "    patern: sglang\n")
    with pytest.raises(PlaybookError) as exc:
        load_playbook(path)
    assert str(exc.value) == (f"{path}:5:5: stage 'stop': unknown key 'patern' for type "
                              "signal (did you mean 'pattern'?)")


def test_unknown_stage_type(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstages:\n  - {name: a, type: signl, pattern: x}\n")
    with pytest.raises(PlaybookError) as exc:
        load_playbook(path)
    assert str(exc.value) == (f"{path}:3:21: stage 1: unknown stage type 'signl' "
                              "(did you mean 'signal'?)")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstage: []\n")
    with pytest.raises(PlaybookError) as exc:
        load_playbook(path)
    assert str(exc.value) == f"{path}:2:1: unknown key 'stage' (did you mean 'stages'?)"


def test_unknown_verify_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nverify:\n  max_used: 0\n")
    with pytest.raises(PlaybookError, match=r"pb.yaml:3:3: verify: unknown key 'max_used' "
                                            r"\(did you mean 'max_used_mib'\?\)"):
        load_playbook(path)


def test_missing_required_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstages:\n  - {name: r, type: restore}\n")
    with pytest.raises(PlaybookError, match=r"pb.yaml:3:5: stage 'r': missing required key "
                                            r"'file'"):
        load_playbook(path)


def test_invalid_yaml_has_a_position(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nstages: [\n")
    with pytest.raises(PlaybookError, match=r"pb.yaml:3:1: invalid YAML"):
        load_playbook(path)


def test_undefined_variable_names_file_line_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nvars: {dump_dir: /dev/shm/hs}\nstages:\n"
                           "  - name: rm\n    type: remove\n    paths: ['{{ dump_dri }}']\n")
    pb = load_playbook(path)
    with pytest.raises(VariableError) as exc:
        resolve(pb, {}, {})
    assert str(exc.value) == (f"{path}:6:12: undefined variable 'dump_dri' "
                              "(did you mean 'dump_dir'?)")


@pytest.mark.parametrize(("extra", "message"), [
    ({"grace": "soon"}, "stage 'stop-server': grace must be a non-negative number of seconds"),
    ({"grace": "-1"}, "grace must be a non-negative number"),
    ({"max_used_mib": "1.5"}, "stage 'reset-leaked': max_used_mib must be a non-negative "
                              "integer"),
    ({"server_pattern": r"sglang\d"}, r"'\d' is not POSIX ERE"),
    ({"server_pattern": "sglang(?=x)"}, "'(?' groups are not POSIX ERE"),
    ({"server_pattern": "sgl[ang"}, "invalid regular expression"),
    ({"server_pattern": ".*"}, "matches the empty string"),
    ({"dump_dir": "/"}, "it is / or a top-level directory"),
    ({"dump_dir": "/dev/shm/../../"}, "it is / or a top-level directory"),
    ({"dump_dir": "relative/dir"}, "must be an absolute path"),
    ({"protect": 5}, "protect must be a list of names"),
    # The backup would be the file itself: a restore copied the patched file onto itself.
    ({"backup_suffix": ""}, "backup_suffix is empty, so the backup would be the file itself"),
    ({"backup_suffix": "/../x"}, "holds a '/'"),
])
def test_bad_values_are_rejected_before_anything_is_sent(extra: dict[str, object],
                                                         message: str) -> None:
    pb = load_playbook("post-extraction")
    with pytest.raises(VariableError) as exc:
        resolve(pb, {}, extra)
    assert message in str(exc.value)
    # Named by where the value was set, not by the line of a built-in playbook.
    assert str(exc.value).startswith(f"-e {next(iter(extra))}: "), exc.value
    pb_path = load_playbook("post-extraction").path
    with pytest.raises(VariableError) as in_inventory:
        resolve(pb, extra, {})
    assert str(in_inventory.value).startswith(f"inventory variable '{next(iter(extra))}': ")
    assert pb_path is None or pb_path not in str(in_inventory.value)


@pytest.mark.parametrize(("data", "says"), [
    (b"name: x\nstages: []\n\x01\n", "x.yaml:3:1: invalid YAML: unacceptable character #x0001"),
    (b"name: caf\xe9\n", "x.yaml:1:10: not UTF-8 text (byte 0xe9) (save the file as UTF-8)"),
    (b"name: x\n\tstages: []\n", "x.yaml:2:1: invalid YAML: found character '\\t' that cannot "
     "start any token (indent with spaces, not tabs)"),
])
def test_a_file_yaml_cannot_read_is_an_error_naming_its_line_and_fix(
    tmp_path: Path, data: bytes, says: str
) -> None:
    # A playbook and a -e @file alike: no traceback (an internal error, exit 3) for either.
    (tmp_path / "x.yaml").write_bytes(data)
    with pytest.raises(PlaybookError) as exc:
        load_playbook(str(tmp_path / "x.yaml"))
    assert says in str(exc.value), exc.value
    with pytest.raises(VariableError) as var_exc:
        parse_extra_vars([f"@{tmp_path / 'x.yaml'}"])
    assert says in str(var_exc.value), var_exc.value


def test_a_posix_class_in_a_pattern_prints_no_python_warning() -> None:
    # bash's ERE wants [[:space:]]; Python's re warns of it as a nested set (FutureWarning),
    # which reached the user's terminal.
    from fleetclean.engine.checks import check_ere
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert check_ere("sglang[[:space:]]launch9", None, "pattern") == "sglang[[:space:]]launch9"
    assert not seen, [str(w.message) for w in seen]
