"""ssh_config's Include read as OpenSSH reads it, with OpenSSH's own `ssh -G` as the judge.

paramiko has no Include (fleetclean.transport.includes): a paste of the included files made
the lines after an Include, and an Include inside a Host block, apply to the wrong hosts.
"""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

import pytest
from simhelp import ssh_g

from fleetclean.transport.hops import load_config

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh -G")

NAMES = ("gpu01", "gpu02", "bastion", "b2", "other", "10.1.2.3", "all")


def _ours(config: Path, name: str) -> dict[str, str]:
    found = load_config(str(config)).lookup(name)
    return {"user": found.get("user", getpass.getuser()),
            "hostname": found.get("hostname", name),
            "port": found.get("port", "22")}


def _files(tmp_path: Path, **texts: str) -> Path:
    for name, text in texts.items():
        (tmp_path / name.replace("_", ".")).write_text(text.replace("@", str(tmp_path)))
    return tmp_path / "main.conf"


CASES = {
    # The lines after an Include stay in the block the Include sits in.
    "conditional": dict(
        main_conf="Host gpu*\n  Include @/inc1.conf\n  Port 2222\n"
                  "Include @/inc2.conf\nUser ops\n",
        inc1_conf="User svc\nHost bastion\n  HostName 10.9.9.9\n",
        inc2_conf="Host b2\n  HostName 10.8.8.8\n",
    ),
    # A top-level Include, then settings for every host.
    "top level": dict(
        main_conf="Include @/d/*.conf\nUser ops\nPort 2200\n",
        d_a_conf="Host bastion\n  HostName 10.9.9.9\n",
        d_b_conf="Host b2\n  User b2user\nHost gpu02\n  Port 2202\n",
    ),
    # Nested Includes under a Match and a Host with a negated pattern.
    "nested": dict(
        main_conf="Host gpu* !gpu02\n  Include @/outer.conf\nHost *\n  User last\n",
        outer_conf="Port 2300\nMatch host 10.*\n  Include @/inner.conf\n"
                   "Host bastion gpu01\n  User outeruser\n",
        inner_conf="User inneruser\nHost gpu01\n  Port 2301\n",
    ),
    # One Include naming several files: each starts in the Include's block, not in the
    # last block of the file before it.
    "several files": dict(
        main_conf="Include @/d/*.conf\nHost *\n  Port 2200\nHost gpu*\n"
                  "  Include @/two.conf @/one.conf\n",
        d_a_conf="Host b2\n  HostName 10.0.0.1\n",
        d_b_conf="User ops\nHost bastion\n  Port 2210\n",
        one_conf="Port 2201\n",
        two_conf="Host gpu02\n  User two\n",
    ),
    # "all" as a host name after `host` is that host, not Match's `all`.
    "match host all": dict(
        main_conf="Match host all\n  Include @/m.conf\n",
        m_conf="User inall\nHost all gpu01\n  Port 2500\n",
    ),
    # Match blocks around and inside the included file, HostName rewriting what `host` sees.
    "match": dict(
        main_conf="Host gpu01\n  HostName 10.1.2.3\nMatch host 10.*\n  Include @/m.conf\n"
                  "  Port 2400\nMatch all\n  User everyone\n",
        m_conf="User tenner\nMatch originalhost gpu01\n  Port 2401\n",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_include_means_what_openssh_reads(case: str, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    texts = {k.replace("d_", "d/", 1) if k.startswith("d_") else k: v
             for k, v in CASES[case].items()}
    main = _files(tmp_path, **texts)
    for name in NAMES:
        assert _ours(main, name) == ssh_g(main, name), (case, name)


def test_relative_include_is_under_dot_ssh(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # ssh_config(5): a relative Include of a user configuration is under ~/.ssh, whatever
    # the directory of the file that holds it.
    (tmp_path / ".ssh" / "conf.d").mkdir(parents=True)
    (tmp_path / ".ssh" / "conf.d" / "gpu.conf").write_text("Host gpu01\n  User viadotssh\n")
    (tmp_path / "elsewhere").mkdir()
    main = tmp_path / "elsewhere" / "config"
    main.write_text("Include conf.d/*.conf\nUser ops\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config(str(main)).lookup("gpu01")["user"] == "viadotssh"
    assert load_config(str(main)).lookup("gpu02")["user"] == "ops"


def test_a_file_that_includes_itself_is_refused(tmp_path: Path) -> None:
    main = tmp_path / "main.conf"
    main.write_text(f"Include {main}\n")
    with pytest.raises(Exception, match="nested more than 16 deep"):
        load_config(str(main))


def test_match_criteria_paramiko_does_not_know_are_judged_not_taken_as_matching() -> None:
    # paramiko took `Match !localnetwork ...` (and any criterion it does not know) as
    # matching: the off-site bastion was used on site too (paramiko#2632). localnetwork is
    # judged by this machine's addresses, as by ssh (every machine has 127.0.0.1); what
    # fleetclean cannot judge (tagged: it sets no Tag; sessiontype...) is never applied.
    from fleetclean.transport.hops import parse_config
    from fleetclean.transport.includes import expand_text

    text = ("Match !localnetwork 127.0.0.0/8\n  ProxyJump offsite\n"
            "Match localnetwork 127.0.0.0/8 host node*\n  User onsite\n"
            "Match !localnetwork 203.0.113.0/24\n  Port 2222\n"
            "Match tagged gpu\n  IdentityFile /tagged\n"
            "Match sessiontype shell\n  RequestTTY yes\n")
    config = parse_config(expand_text(text, read=lambda p: "", found=lambda w: []))
    found = dict(config.lookup("node07"))
    assert found.get("user") == "onsite" and found.get("port") == "2222"
    assert "proxyjump" not in found and "identityfile" not in found
    assert "requesttty" not in found
