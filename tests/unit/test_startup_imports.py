"""What each kind of invocation imports: start-up is paid on every run (issue 18).

Each case runs the CLI in a fresh interpreter and lists the top-level packages it imported.
``--version``, every ``--help`` and a mistake on the command line load neither the SSH stack
(paramiko, fabric, invoke and their crypto) nor rich nor yaml; a bad-input error found later
(an inventory, a playbook) may read YAML but still loads neither the SSH stack nor rich;
``status --local --json`` loads no SSH stack and no rich; and the first import of the SSH
stack, whichever transport module makes it, leaves out what invoke imports only for its test
double (``fleetclean.transport.sshlib``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetclean.commands.parser import build_parser

SSH_STACK = frozenset({"paramiko", "fabric", "invoke", "cryptography", "nacl", "bcrypt"})
# What invoke.context's ``from unittest.mock import Mock`` brings in.
INVOKE_TEST_DOUBLE = frozenset({"unittest", "asyncio", "ssl"})
CHEAP = SSH_STACK | INVOKE_TEST_DOUBLE | {"rich", "yaml"}

PROBE = """
import sys
from fleetclean import cli
try:
    status = cli.main(sys.argv[1:])
except SystemExit as exc:  # argparse's --help and --version
    status = exc.code
print("\\nMODULES", status, *sorted({m.split(".")[0] for m in sys.modules}), file=sys.stderr)
"""


def imported(*argv: str) -> tuple[int, set[str]]:
    """(exit status, top-level packages imported) of ``fleetclean ARGV``."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    last = done.stderr.rstrip().rsplit("\n", 1)[-1].split()
    assert last[:1] == ["MODULES"], done.stderr
    return int(last[1]), set(last[2:])


def fresh(code: str, *argv: str) -> str:
    """The standard output of ``code`` run in a fresh interpreter (``python -c``); a
    failure fails the test with its standard error."""
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _commands() -> list[str]:
    parser = build_parser(with_sim=False)
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(name for name in sub.choices if not name.startswith("_"))


HELPS = [
    ["--version"],
    ["--help"],
    [],
    *([command, "--help"] for command in _commands()),
    ["export", "script", "--help"],
    ["sim", "up", "--help"],
]


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_version_and_help_load_no_ssh_stack_rich_or_yaml(argv: list[str]) -> None:
    status, modules = imported(*argv)
    assert status == 0
    assert not modules & CHEAP, sorted(modules & CHEAP)


@pytest.mark.parametrize("argv", [
    ["status", "--no-such-option"],
    ["run"],
], ids=" ".join)
def test_a_command_line_mistake_loads_no_ssh_stack_rich_or_yaml(argv: list[str]) -> None:
    status, modules = imported(*argv)
    assert status == 4
    assert not modules & CHEAP, sorted(modules & CHEAP)


@pytest.mark.parametrize("argv", [
    ["run", "no-such-playbook", "--local"],
    ["status", "-i", "/nonexistent/inventory.yaml"],
    ["status", "--local", "-i", "x.yml"],
], ids=" ".join)
def test_a_bad_input_error_loads_no_ssh_stack_or_rich(argv: list[str]) -> None:
    status, modules = imported(*argv)
    assert status == 4
    assert not modules & (SSH_STACK | INVOKE_TEST_DOUBLE | {"rich"}), sorted(modules)


def test_a_local_status_as_json_loads_no_ssh_stack_or_rich() -> None:
    # Read-only: this machine's GPUs (or, without nvidia-smi, an error row).
    _, modules = imported("status", "--local", "--json")
    assert "fleetclean" in modules
    assert not modules & (SSH_STACK | INVOKE_TEST_DOUBLE | {"rich"}), sorted(modules)


@pytest.mark.parametrize("module", [
    "fleetclean.transport.session",
    "fleetclean.transport.hops",
    "fleetclean.transport.pool",
    "fleetclean.transport.upstream",
    "fleetclean.inventory.ssh_settings",
])
def test_the_ssh_stack_comes_without_invokes_test_double(module: str) -> None:
    probe = (f"import sys, {module}\n"
             "from fleetclean.inventory import ssh_settings\n"
             "ssh_settings.load_config('/dev/null')\n"
             "print(*sorted({m.split('.')[0] for m in sys.modules}))")
    modules = set(fresh(probe).split())
    assert {"paramiko", "fabric", "invoke"} <= modules
    assert not modules & INVOKE_TEST_DOUBLE, sorted(modules & INVOKE_TEST_DOUBLE)


def test_invokes_mock_context_still_works_after_fleetclean_imported_invoke() -> None:
    probe = ("import fleetclean.transport.sshlib\n"
             "from invoke import MockContext, Result\n"
             "ctx = MockContext(run=Result('hi'))\n"
             "assert ctx.run('true').stdout == 'hi'\n"
             "ctx.run.assert_called_once_with('true')\n"
             "from unittest.mock import patch\n"
             "print(patch.__module__)")
    assert fresh(probe).strip() == "unittest.mock"


def test_paramikos_version_and_invokes_yaml_come_without_their_slow_imports() -> None:
    """The first import of the SSH stack loads neither ``importlib.metadata`` (paramiko's
    ``__version__``) nor invoke's vendored PyYAML; paramiko's version, which it sends in
    its SSH banner, is still the installed one, and invoke still reads a YAML config file."""
    probe = ("import sys, tempfile, yaml, fleetclean.transport.session\n"
             "from fleetclean.transport.sshlib import paramiko\n"
             "import invoke\n"
             "left = [m for m in sys.modules if m == 'importlib.metadata'\n"
             "        or m.startswith('invoke.vendor.yaml')]\n"
             "from importlib import metadata\n"
             "with tempfile.NamedTemporaryFile('w', suffix='.yaml') as f:\n"
             "    f.write('run:\\n  echo: true\\n'); f.flush()\n"
             "    config = invoke.Config(runtime_path=f.name); config.load_runtime()\n"
             "print(left, paramiko.__version__, metadata.version('paramiko'),\n"
             "      paramiko.Transport._CLIENT_ID, config.run.echo)")
    left, ours, real, banner, echo = fresh(probe).rsplit(" ", 4)
    assert left == "[]"
    assert ours == real and banner == f"paramiko_{real}" and echo.strip() == "True"


def test_a_version_not_named_by_one_dist_info_is_asked_of_importlib_metadata(
        tmp_path: Path) -> None:
    for name, infos in (("one", ["1.2.3"]), ("two", ["1.0", "2.0"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        for version in infos:
            info = tmp_path / f"{name}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                           f"Version: {version}\n")
    probe = ("import sys; sys.path.insert(0, sys.argv[1])\n"
             "from fleetclean.transport import sshlib\n"
             "from importlib import metadata\n"
             "print(sshlib._installed_version('one'), sshlib._installed_version('two'),\n"
             "      metadata.version('two'))")
    one, two, real = fresh(probe, str(tmp_path)).split()
    assert one == "1.2.3"
    assert two == real  # two candidates: the real module's choice, whichever it is
