"""The Jinja expressions inventories write their connection variables in, rendered as
Ansible renders them (``inventory/templates.py``), and every other one refused with the
reason: a guessed host name or user reaches another machine or account."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fleetclean.cli import Env, main
from fleetclean.inventory import load_inventory
from fleetclean.inventory.templates import Unrendered, render

HOST = "gpu01.lab"
VARS: dict[str, object] = {"ip": "10.0.0.7", "site": "EU", "port": "2201", "empty": "",
                           "nothing": None, "flag": True, "ratio": 1.5, "nested": "{{ ip }}"}
ENV = {"USER": "ada", "BLANK": "", "KEYS": "/home/ada/.ssh"}


@pytest.mark.parametrize(("template", "rendered"), [
    # The forms team inventories hold (Ansible's own docs and ansible-core 2.21's output).
    ("{{ lookup('env', 'USER') }}", "ada"),
    ('{{ lookup("ansible.builtin.env", "USER") }}', "ada"),
    ("{{ lookup('env', 'UNSET') }}", ""),  # Ansible: an unset variable reads empty
    ("{{ lookup('env', 'UNSET', default='ops') }}", "ops"),
    ("{{ lookup('env', 'BLANK', default='ops') }}", ""),  # set, though empty
    ("{{ lookup('env', 'BLANK') | default('ops', true) }}", "ops"),
    ("{{ lookup('env', 'BLANK') | default('ops') }}", ""),
    ("{{ lookup('env','KEYS') }}/cluster_ed25519", "/home/ada/.ssh/cluster_ed25519"),
    ("{{ lookup('env', 'KEYS') ~ '/' ~ site | lower ~ '_key' }}", "/home/ada/.ssh/eu_key"),
    ("{{ ip | default(inventory_hostname) }}", "10.0.0.7"),
    ("{{ ib_ip | default(inventory_hostname) }}", HOST),
    ("{{ ib_ip | d(inventory_hostname_short ~ '.ib') }}", "gpu01.ib"),
    ("{{ empty | default('x') }}", ""),
    ("{{ empty | default('x', true) }}", "x"),
    ("{{ nothing | default('x', true) }}", "x"),
    ("{{ hostvars[inventory_hostname]['ip'] }}", "10.0.0.7"),
    ("{{ hostvars[inventory_hostname].ip }}", "10.0.0.7"),
    ('{{ hostvars["gpu01.lab"]["site"] | upper }}', "EU"),
    ("{{ vars['nested'] }}", "10.0.0.7"),
    ("{{ port | int }}", "2201"),
    ("{{ (site ~ '-' ~ ip) | replace('.', '-') | lower }}", "eu-10-0-0-7"),
    ("{{ '  ops ' | trim }}@{{ 22 | string }}", "ops@22"),
    ("{{ 'it\\'s' }}", "it's"),
    ("{{ 'a\\x41\\u00e9' }}", "aA\u00e9"),  # Python's escapes, as Jinja's lexer reads them
    ("{{ lookup('env', ' USER extra') }}", "ada"),  # Ansible takes the term's first word
    ("{{ empty | default('d', 1) }}", "d"),  # any true `boolean`
    ("{{ empty | default(default_value='d', boolean=true) }}", "d"),
    ("{{ empty | d('d', false) }}", ""),
    ("{{ ib_ip | default }}", ""),
    ("{{ ratio }}", "1.5"),
])
def test_a_template_renders_as_ansible_renders_it(template: str, rendered: str) -> None:
    assert render(template, HOST, VARS, environ=ENV) == rendered


@pytest.mark.parametrize(("template", "why"), [
    ("{{ ib_ip }}", "ib_ip is not set for this host"),
    ("{{ nothing | default('x') }}", "nothing is not set for this host"),  # null: defined
    ("{{ ib_ip | lower }}", "ib_ip is not set for this host"),
    ("{{ ip ~ ib_ip }}", "ib_ip is not set for this host"),
    ("{{ site | regex_replace('E', 'e') }}", "uses the filter regex_replace"),
    ("{{ lookup('file', '/etc/hostname') }}", "uses the lookup of 'file'"),
    ("{{ lookup('env', 'A', 'B') }}", "other than one name and a default"),
    ("{{ lookup('env', ' ') }}", "looks up no environment variable"),
    ("{{ site | lower(x=1) }}", "the filter lower with named arguments"),
    ("{{ hostvars['gpu02']['ip'] }}", "reads hostvars of another host (gpu02)"),
    ("{{ ip if ip else 'x' }}", "uses 'if'"),
    ("{{ port + 1 }}", "uses '+'"),
    ("{{ site | int }}", "gives no whole number"),  # Jinja's int: 0, a guessed port
    ("{{ flag }}", "not a text or a number"),
    ("{{ range(3) }}", "uses the function range"),
    ("{{ ip.split('.') }}", "an attribute or item of a variable"),
    ("{{ }}", "is empty"),
    ("{{ lookup('env', 'USER' }}", "cut short"),
    ("{% if x %}y{% endif %}", "holds a Jinja block or comment"),
    ("{{ ip", "has an unclosed"),
])
def test_anything_else_is_refused_with_the_reason(template: str, why: str) -> None:
    with pytest.raises(Unrendered, match=None) as err:
        render(template, HOST, VARS, environ=ENV)
    assert why in str(err.value)


def test_what_a_template_reads_is_listed_even_behind_a_default() -> None:
    # A password's template makes every variable it reads a secret (inventory/build.py).
    used: set[str] = set()
    render("{{ pw | default(vars['fallback_pw']) }}", HOST, {"fallback_pw": "s"}, used=used)
    assert used == {"pw", "fallback_pw"}


def test_a_variable_that_names_itself_stops() -> None:
    with pytest.raises(Unrendered, match="refers to itself"):
        render("{{ a | default('x') }}", HOST, {"a": "{{ b }}", "b": "{{ a }}"})


def test_a_template_that_renders_empty_is_unset_or_refused_as_ansible_treats_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # lookup('env') of an unset variable reads empty. Ansible's ssh plugin then passes no
    # user and no key (ssh's defaults decide), and fails the host for an empty address:
    # fleetclean leaves the first two unset, said, and refuses the third before any host
    # is reached (exit 4, the file's line, the fix).
    monkeypatch.delenv("FC_TPL_NOT_SET", raising=False)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu01:\n"
        "      ansible_user: \"{{ lookup('env', 'FC_TPL_NOT_SET') }}\"\n"
        "      ansible_ssh_private_key_file: \"{{ lookup('env', 'FC_TPL_NOT_SET') }}\"\n")
    loaded = load_inventory(str(inventory))
    host = loaded.hosts["gpu01"]
    assert (host.user, host.key) == (None, None)
    said = [w for w in loaded.warnings if "renders empty" in w]
    assert len(said) == 2 and all("left unset, as Ansible leaves it" in w for w in said)
    with inventory.open("a") as f:
        f.write("      ansible_host: \"{{ lookup('env', 'FC_TPL_NOT_SET') }}\"\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(["status", "-i", str(inventory)], Env(stdout=out, stderr=err, environ={}))
    (line,) = err.getvalue().splitlines()
    assert code == 4 and out.getvalue() == ""
    assert line.startswith(f"fleetclean: error: {inventory}:6:")
    assert "ansible_host: its template" in line and "renders empty for gpu01" in line
    assert "Traceback" not in err.getvalue()


@pytest.mark.parametrize(("key", "template"), [
    ("ansible_host", "{{ ips[inventory_hostname] }}"),
    ("ansible_port", "{{ 2200 + rack }}"),
    ("ansible_become_user", "{{ svc | regex_replace('x', '') }}"),
])
def test_an_address_port_or_become_it_cannot_render_stops_the_run(
    tmp_path: Path, key: str, template: str
) -> None:
    # Left unset, the inventory name (port 22, root) stood for it: another machine, or
    # other rights, than Ansible's. The run stops before any host is reached (exit 4).
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  hosts:\n    gpu01:\n      {key}: \"{template}\"\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(["status", "-i", str(inventory)], Env(stdout=out, stderr=err, environ={}))
    (line,) = err.getvalue().splitlines()
    assert code == 4 and out.getvalue() == ""
    assert line.startswith(f"fleetclean: error: {inventory}:4:")
    assert f"{key} is a Jinja template" in line and f"write {key}'s value itself" in line


def test_a_port_from_a_template_is_the_port_reached(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars:\n    ansible_port: \"{{ ssh_port | int }}\"\n"
                         "  hosts:\n    gpu01: {ssh_port: '2201'}\n")
    assert load_inventory(str(inventory)).hosts["gpu01"].port == 2201


def test_the_inventory_command_says_what_it_left_unset(tmp_path: Path) -> None:
    # `fleetclean inventory` is how an inventory is checked: it said nothing of a template
    # it left unset, where status and run did.
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n"
                         "      ansible_user: \"{{ ops | regex_replace('a', 'b') }}\"\n")
    out, err = io.StringIO(), io.StringIO()
    code = main(["inventory", "-i", str(inventory), "--json"],
                Env(stdout=out, stderr=err, environ={}))
    (line,) = err.getvalue().splitlines()
    assert code == 0 and line.startswith(f"fleetclean: warning: {inventory}:4: ansible_user")
    assert "uses the filter regex_replace" in line
