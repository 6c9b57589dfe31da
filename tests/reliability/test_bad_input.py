"""Bad input through the CLI, end to end, against a live simulated fleet.

Every case is a ``fleetclean run`` (or ``status``) whose inventory names live simulated
nodes. Each must end with exit 4 and exactly one line on stderr (the file:line where there
is one, and a fix), no traceback, nothing on stdout, and no SSH connection reaching any
node: every node's sshd log (LogLevel VERBOSE: one "Connection from" line per TCP
connection) is unchanged, and a canary GPU holder on each node still runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from simhelp import Cli, ssh_log_count

from fleetclean.sim import SimFleet

pytestmark = pytest.mark.sim

DATA_BAD = Path(__file__).resolve().parents[1] / "data" / "inventories" / "bad"


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # {inv} the fleet's inventory, {f} the case's file, {dir} a tmp dir
    expect: str  # a fragment of the one error line ({f} and {inv} substituted)
    file: str | None = None  # content of {f} ({nodeN} -> address of node N, {key})
    name: str = "case.yml"


GOOD_HOSTS = """\
all:
  hosts:
    node01: {ansible_host: {node1}, ansible_user: root, ansible_ssh_private_key_file: {key}}
    node02: {ansible_host: {node2}, ansible_user: root, ansible_ssh_private_key_file: {key}}
  vars:
    ansible_ssh_common_args: -o UserKnownHostsFile={known}
"""


def inv(extra: str) -> str:
    """A valid inventory of the live nodes, with ``extra`` appended."""
    return GOOD_HOSTS + extra


def book(body: str) -> str:
    return "name: bad\ndescription: a broken playbook\n" + body


RUN = ("run", "post-extraction", "-i", "{inv}")
STAGE_OK = "stages:\n  - name: s\n    type: signal\n    pattern: sglang\n"

CASES: list[Case] = [
    # ---- inventories naming the live nodes, each with one defect -------------------------
    Case("inv-missing-file", ("run", "post-extraction", "-i", "{dir}/nope.yml"),
         "nope.yml"),
    Case("inv-is-directory", ("run", "post-extraction", "-i", "{dir}"), "{dir}"),
    Case("inv-port-text", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    ansible_port: ssh\n")),
    Case("inv-port-huge", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    ansible_port: 65536\n")),
    Case("inv-connection-winrm", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    ansible_connection: winrm\n")),
    Case("inv-become-perhaps", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    ansible_become: perhaps\n")),
    Case("inv-become-method-su", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    ansible_become_method: su\n")),
    Case("inv-bad-var-name", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    grace-period: 3\n")),
    Case("inv-children-typo", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("  childs:\n    gpus:\n      hosts:\n        node01:\n")),
    Case("inv-dup-host-key", ("run", "post-extraction", "-i", "{f}"), "{f}:5",
         inv("").replace("  vars:", "    node01: {}\n  vars:")),
    Case("inv-tab", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("\tgrace: 3\n")),
    Case("inv-range-backwards", ("run", "post-extraction", "-i", "{f}"), "{f}:10",
         inv("  children:\n    g:\n      hosts:\n        node[09:01]:\n")),
    Case("inv-ssh-args-quote", ("run", "post-extraction", "-i", "{f}"), "{f}:6",
         inv("").replace("UserKnownHostsFile={known}", "'UserKnownHostsFile={known}")),
    Case("inv-ini-garbage", ("run", "post-extraction", "-i", "{f}"), "{f}:2",
         "[gpus]\nnode01 ansible_host\n", "case.ini"),
    Case("inv-vault", ("run", "post-extraction", "-i", "{f}"), "{f}:7",
         inv("    secret: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n")),
    Case("inv-empty", ("run", "post-extraction", "-i", "{f}"), "{f}", "# nothing\n"),
    # ---- --limit patterns --------------------------------------------------------------
    Case("limit-no-match", (*RUN, "-l", "gpu99"), "gpu99"),
    Case("limit-only-exclusion-of-all", (*RUN, "-l", "!all"), "!all"),
    Case("limit-bad-regex", (*RUN, "-l", "~[unclosed"), "[unclosed"),
    Case("limit-missing-file", (*RUN, "-l", "@{dir}/nolimit.txt"), "nolimit.txt"),
    Case("limit-empty", (*RUN, "-l", ""), "--limit is empty"),  # was: every host!
    Case("limit-blank", (*RUN, "-l", "  "), "--limit is empty"),
    # ---- playbooks ---------------------------------------------------------------------
    Case("book-unknown-builtin", ("run", "post-extraktion", "-i", "{inv}"), "post-extraction"),
    Case("book-missing-file", ("run", "{dir}/missing.yaml", "-i", "{inv}"), "missing.yaml"),
    Case("book-not-yaml", ("run", "{f}", "-i", "{inv}"), "{f}:4",
         book("stages: [\n  - name: s\n"), "b.yaml"),
    Case("book-list-at-top", ("run", "{f}", "-i", "{inv}"), "{f}:1", "- name: x\n", "b.yaml"),
    Case("book-no-stages", ("run", "{f}", "-i", "{inv}"), "no stages and no verify",
         book(""), "b.yaml"),  # was: ran nothing and reported every host clean
    Case("book-empty-stages", ("run", "{f}", "-i", "{inv}"), "{f}:3",
         book("stages: []\n"), "b.yaml"),
    Case("book-unknown-type", ("run", "{f}", "-i", "{inv}"), "{f}:5",
         book("stages:\n  - name: s\n    type: pkill\n    pattern: x\n"), "b.yaml"),
    Case("book-type-typo", ("run", "{f}", "-i", "{inv}"), "signal",
         book("stages:\n  - name: s\n    type: signall\n    pattern: x\n"), "b.yaml"),
    Case("book-unknown-option", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "    graze: 3\n"), "b.yaml"),
    Case("book-missing-pattern", ("run", "{f}", "-i", "{inv}"), "{f}:4",
         book("stages:\n  - name: s\n    type: signal\n"), "b.yaml"),
    Case("book-bad-signal", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "    signal: STOPIT\n"), "b.yaml"),
    Case("book-perl-regex", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: signal\n    pattern: 'worker\\d+'\n"),
         "b.yaml"),
    Case("book-empty-match-regex", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: signal\n    pattern: 'x*'\n"), "b.yaml"),
    Case("book-remove-root", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: remove\n    paths: [/]\n"), "b.yaml"),
    Case("book-remove-toplevel", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: remove\n    paths: [/usr/../etc]\n"), "b.yaml"),
    Case("book-remove-relative", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: remove\n    paths: [tmp/x]\n"), "b.yaml"),
    Case("book-undefined-var", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: signal\n    pattern: '{{ nope }}'\n"),
         "b.yaml"),
    Case("book-filter-expression", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book("vars: {p: x}\nstages:\n  - name: s\n    type: signal\n"
              "    pattern: '{{ p | upper }}'\n"), "b.yaml"),
    Case("book-unbalanced-braces", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book("vars: {p: x}\nstages:\n  - name: s\n    type: signal\n"
              "    pattern: '{{ p }}}}'\n"), "b.yaml"),
    Case("book-duplicate-stage", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "  - name: s\n    type: signal\n    pattern: other\n"), "b.yaml"),
    Case("book-grace-negative", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "    grace: -1\n"), "b.yaml"),
    Case("book-match-argv", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "    match: argv\n"), "b.yaml"),
    Case("book-scope-typo", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book(STAGE_OK + "    scope: relative\n"), "b.yaml"),
    Case("book-verify-interval-zero", ("run", "{f}", "-i", "{inv}"), "{f}:9",
         book(STAGE_OK + "verify:\n  max_used_mib: 0\n  interval: 0\n"), "b.yaml"),
    Case("book-shell-empty", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: shell\n    command: ''\n"), "b.yaml"),
    Case("book-shell-var-in-single-quotes", ("run", "{f}", "-i", "{inv}"), "{f}:7",
         book("vars: {x: a}\nstages:\n  - name: s\n    type: shell\n"
              "    command: \"echo '{{ x }}'\"\n"),
         "b.yaml"),  # was: ran and printed the literal "${FC_VAR_x}", never the value
    Case("book-restore-relative", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: restore\n    file: model.py\n"), "b.yaml"),
    Case("book-guard-relative", ("run", "{f}", "-i", "{inv}"), "{f}:6",
         book("stages:\n  - name: s\n    type: guard\n    path: shm/x\n"), "b.yaml"),
    # ---- -e values ---------------------------------------------------------------------
    Case("e-no-equals", (*RUN, "-e", "grace"), "KEY=VALUE"),
    Case("e-bad-name", (*RUN, "-e", "1grace=3"), "not an identifier"),
    Case("e-dash-name", (*RUN, "-e", "max-used-mib=3"), "not an identifier"),
    Case("e-bad-json", (*RUN, "-e", '{"grace": 3'), "invalid JSON"),
    Case("e-json-list", (*RUN, "-e", "[1, 2]"), "KEY=VALUE"),
    Case("e-json-not-object", (*RUN, "-e", '{"grace": 3} x'), "invalid JSON"),
    Case("e-file-missing", (*RUN, "-e", "@{dir}/vars.yml"), "vars.yml"),
    Case("e-file-bad-yaml", (*RUN, "-e", "@{f}"), "{f}:2", "grace: 3\n  - x: [\n", "v.yml"),
    Case("e-file-list", (*RUN, "-e", "@{f}"), "{f}", "- grace\n", "v.yml"),
    Case("e-grace-text", (*RUN, "-e", "grace=soon"), "grace"),
    Case("e-grace-negative", (*RUN, "-e", "grace=-3"), "grace"),
    Case("e-grace-nan", (*RUN, "-e", "grace=nan"), "grace"),
    Case("e-grace-inf", (*RUN, "-e", "grace=inf"), "grace"),
    Case("e-grace-bool", (*RUN, "-e", '{"grace": true}'), "grace"),
    Case("e-max-used-negative", (*RUN, "-e", "max_used_mib=-1"), "max_used_mib"),
    Case("e-max-used-fraction", (*RUN, "-e", "max_used_mib=1.5"), "max_used_mib"),
    Case("e-verify-timeout-text", (*RUN, "-e", "verify_timeout=30s"), "timeout"),
    Case("e-pattern-empty", (*RUN, "-e", "server_pattern="), "server_pattern"),
    Case("e-pattern-dotstar", (*RUN, "-e", "worker_pattern=.*"), "matches the empty"),
    Case("e-pattern-perl", (*RUN, "-e", "server_pattern=(?i)sglang"), "POSIX"),
    Case("e-pattern-digit", (*RUN, "-e", "worker_pattern=TP\\d"), "POSIX"),
    Case("e-pattern-invalid", (*RUN, "-e", "server_pattern=[abc"), "invalid regular"),
    Case("e-pattern-lazy", (*RUN, "-e", "server_pattern=sgl.+?x"), "lazy"),
    Case("e-dump-dir-root", (*RUN, "-e", "dump_dir=/"), "top-level"),
    Case("e-dump-dir-top", (*RUN, "-e", "dump_dir=/tmp"), "top-level"),
    Case("e-dump-dir-dotdot", (*RUN, "-e", "dump_dir=/dev/shm/../.."), "top-level"),
    Case("e-dump-dir-relative", (*RUN, "-e", "dump_dir=dev/shm/x"), "absolute"),
    Case("e-dump-dir-nul", (*RUN, "-e", '{"dump_dir": "/dev/shm/a\\u0000b"}'), "NUL"),
    Case("e-model-relative", (*RUN, "-e", "model_file=models/x.py"), "absolute"),
    Case("e-protect-numbers", (*RUN, "-e", '{"protect": [1, 2]}'), "protect"),
    Case("e-lock-wait-text", (*RUN, "-e", "lock_wait=forever"), "lock_wait"),
    # nvidia-smi waited for no time at all: every host would read as hung.
    Case("e-smi-timeout-zero", (*RUN, "-e", "smi_timeout=0"), "smi_timeout must be a positive"),
    Case("e-force-maybe", (*RUN, "-e", "force=maybe"), "force"),
    Case("e-dump-dir-list-of-lists", (*RUN, "-e", '{"dump_dir": [["/dev/shm/x"]]}'),
         "paths must be a string"),
    Case("inv-var-grace-text", ("run", "post-extraction", "-i", "{f}"), "grace",
         inv("    grace: tomorrow\n")),
    Case("inv-var-pattern-perl", ("run", "post-extraction", "-i", "{f}"), "POSIX",
         inv("    worker_pattern: 'TP\\d'\n")),
    # ---- options -----------------------------------------------------------------------
    Case("opt-forks-zero", (*RUN, "-f", "0"), "--forks"),
    Case("opt-forks-text", (*RUN, "-f", "many"), "--forks"),
    Case("opt-connect-timeout-zero", (*RUN, "--connect-timeout", "0"), "--connect-timeout"),
    Case("opt-connect-timeout-negative", (*RUN, "--connect-timeout=-1"), "--connect-timeout"),
    Case("opt-connect-timeout-nan", (*RUN, "--connect-timeout", "nan"), "--connect-timeout"),
    Case("opt-timeout-inf", (*RUN, "--timeout", "inf"), "--timeout"),
    Case("opt-json-and-csv", (*RUN, "--json", "--csv"), "--csv"),
    Case("opt-unknown", (*RUN, "--frobnicate"), "--frobnicate"),
    Case("opt-no-inventory", ("run", "post-extraction"), "-i"),
    Case("opt-no-playbook", ("run", "-i", "{inv}"), "PLAYBOOK"),
    Case("opt-unknown-command", ("runn", "post-extraction", "-i", "{inv}"), "runn"),
    Case("opt-status-bad-e", ("status", "-i", "{inv}", "-e", "max_used_mib=lots"),
         "max_used_mib"),
    Case("opt-status-watch-text", ("status", "-i", "{inv}", "--watch", "often"), "--watch"),
    Case("opt-status-forks-negative", ("status", "-i", "{inv}", "-f", "-2"), "--forks"),
    Case("opt-become-method-su", (*RUN, "-b", "--become-method", "su"), "--become-method"),
    Case("opt-become-user-empty", (*RUN, "-b", "--become-user", ""), "--become-user is empty"),
    Case("e-become-password", (*RUN, "-b", "-e", "ansible_become_password=hunter2"),
         "-e ansible_become_password: a password on the command line"),
]


@pytest.fixture(scope="module")
def fleet(module_fleet_factory) -> Iterator[SimFleet]:
    fleet = module_fleet_factory(2)
    for node in fleet.nodes:
        fleet.spawn(node.name, "sglang", gpus="0-1")  # would be killed if anything ran
    yield fleet


def _fill(text: str, fleet: SimFleet, f: Path, d: Path) -> str:
    values = {"inv": fleet.inventory_path, "f": f, "dir": d, "key": fleet.client_key_path,
              "known": fleet.known_hosts_path, "node1": fleet.nodes[0].address,
              "node2": fleet.nodes[1].address}
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return text


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_4_with_one_line_and_no_ssh(
    case: Case, fleet: SimFleet, cli: Cli, tmp_path: Path
) -> None:
    f = tmp_path / case.name
    if case.file is not None:
        f.write_text(_fill(case.file, fleet, f, tmp_path))
    argv = [_fill(a, fleet, f, tmp_path) for a in case.argv]
    before = ssh_log_count(fleet)
    server_before = {p.pid for p in fleet.processes("node01")}

    res = cli(*argv)

    lines = res.err.splitlines()
    assert res.code == 4, (res.code, res.err, res.out)
    assert len(lines) == 1, res.err
    assert lines[0].startswith("fleetclean: error: "), lines[0]
    assert "Traceback" not in res.err and res.out == ""
    assert _fill(case.expect, fleet, f, tmp_path) in lines[0], lines[0]
    assert ssh_log_count(fleet) == before, "a bad input reached a node's sshd"
    assert {p.pid for p in fleet.processes("node01")} == server_before


@pytest.mark.parametrize("bad", sorted(p.name for p in DATA_BAD.iterdir()))
def test_inventory_corpus_through_the_cli(bad: str, fleet: SimFleet, cli: Cli) -> None:
    """tests/inventory's corpus (messages checked there), here through `fleetclean run`:
    exit 4, one line naming the file, nothing sent."""
    before = ssh_log_count(fleet)
    res = cli("run", "post-extraction", "-i", DATA_BAD / bad, "--json")
    assert res.code == 4, res.err
    assert len(res.err.splitlines()) == 1 and str(DATA_BAD / bad) in res.err, res.err
    assert "Traceback" not in res.err and res.out == ""
    assert ssh_log_count(fleet) == before


def test_corpus_has_at_least_60_cases() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
