"""The local connection: the same bash -s path as SSH, without a network."""

import json
import subprocess
import sys
import time

from fleetclean.models import Host
from fleetclean.transport import Options, Session
from fleetclean.transport.become import plan
from fleetclean.transport.classify import Phase, Where, classify

LOCAL = Host(name="here", address="localhost", connection="local")


def test_script_travels_on_stdin_and_lines_stream_back() -> None:
    seen: list[str] = []
    with Session(Options(timeout=10)) as session:
        out = session.run(LOCAL, "echo one\necho two >&2\necho three\nexit 3\n", seen.append)
    assert out.ok and out.started
    assert out.exit_code == 3
    assert seen == ["one", "three"]
    assert out.stderr == "two\n"


def test_script_text_is_not_in_any_argv() -> None:
    marker = "fleetclean-argv-marker-7f3a"
    script = (
        f"# {marker}\n"
        "tr '\\0' ' ' </proc/$$/cmdline; echo\n"
        "tr '\\0' ' ' </proc/$PPID/cmdline; echo\n"
    )
    with Session(Options(timeout=10)) as session:
        out = session.run(LOCAL, script)
    shell, parent = out.stdout.splitlines()
    assert shell.strip() == "bash --norc -p -s"
    assert marker not in shell and marker not in parent


def test_a_script_past_its_timeout_is_stopped_and_reported() -> None:
    t0 = time.monotonic()
    with Session(Options(timeout=0.5)) as session:
        out = session.run(LOCAL, "echo started\nread -r -t 30 _ </dev/zero || true\n"
                          "exec 3<>/dev/null; while :; do :; done\n")
    assert time.monotonic() - t0 < 5
    assert out.failure is not None and out.failure.kind == "timeout"
    assert "started" in out.stdout


def test_become_goes_through_sudo_without_a_password_prompt() -> None:
    command = plan(Host("h", "h", become=True), "abc").command
    assert command == ("env LC_ALL=C sudo -n -u root -- bash --norc -p -c "
                       "'echo @@fleetclean-become:abc >&2; exec bash --norc -p -s'")
    assert plan(Host("h", "h")).command == "bash --norc -p -s"


def test_connection_refused_is_unreachable() -> None:
    failure = classify(ConnectionRefusedError(111, "Connection refused"),
                       Where("127.0.0.1", 1), Phase.TCP, 0.01, 5)
    assert failure is not None and failure.kind == "unreachable"
    assert "127.0.0.1:1" in failure.message


def test_unreachable_port_end_to_end() -> None:
    host = Host("gpu01", "127.0.0.1", port=1, user="root")
    with Session(Options(connect_timeout=2, timeout=5)) as session:
        out = session.run(host, "true")
    assert out.failure is not None and out.failure.kind == "unreachable"
    assert not out.started


def test_a_dead_bastion_is_named_in_the_failure() -> None:
    host = Host("gpu01", "10.9.9.9", port=22, user="root", proxy_jump="ops@127.0.0.1:1")
    with Session(Options(connect_timeout=2, timeout=5)) as session:
        out = session.run(host, "true")
    assert out.failure is not None and out.failure.kind == "unreachable"
    assert out.failure.message == (
        "bastion 127.0.0.1 (127.0.0.1:1) unreachable: connection refused"
    )


def test_known_hosts_lines_paramiko_cannot_read_do_not_hide_the_others(tmp_path) -> None:
    import subprocess

    from fleetclean.transport.hostkeys import KnownHosts

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    kind, blob = (tmp_path / "k.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.lab {kind} {blob}\n"
        "damaged line without a key\n"
        f"127.0.1.1 {kind} AAAAnot-base64\n"
        f"127.0.1.2 {kind} {blob}\n"
    )
    keys = KnownHosts((str(known),)).keys
    assert keys.lookup("127.0.1.2") is not None
    assert keys.lookup("127.0.1.1") is None


BLOCK_SSH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("paramiko", "fabric", "invoke"):
            raise ImportError("not on this machine: " + name)
sys.meta_path.insert(0, Block())
from fleetclean.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_local_run_needs_no_ssh_library() -> None:
    # A GPU machine with no sshd may have none of them (the real H200 had neither paramiko
    # nor fabric): `status --local` is read-only, and must run there.
    done = subprocess.run([sys.executable, "-c", BLOCK_SSH, "status", "--local", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "not on this machine" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["hosts"][0]["status"] in ("clean", "dirty", "error")
