"""group_vars/ and host_vars/ beside an inventory file, read as Ansible reads them."""

from __future__ import annotations

import builtins
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetclean.cli import Env, main
from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory

VAULT_FILE = "$ANSIBLE_VAULT;1.1;AES256\n6134353964363266\n"
VAULT_VALUE = "!vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6134353964363266\n"


@pytest.fixture
def put(tmp_path: Path) -> Callable[[str, str], Path]:
    """put("group_vars/all.yml", text): a file under tmp_path, its folders made."""

    def _put(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    return _put


Put = Callable[[str, str], Path]


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = Env(stdout=out, stderr=err, environ={"NO_COLOR": "1", "FLEETCLEAN_SSH_CONFIG": ""})
    return main(list(argv), env), out.getvalue(), err.getvalue()


def test_group_vars_all_gives_the_user_address_port_and_key(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n    gpu02:\n")
    put("group_vars/all.yml", "ansible_user: root\nansible_port: 2222\n"
        "ansible_ssh_private_key_file: /keys/lab\nmax_used_mib: 512\n")
    put("host_vars/gpu02.yml", "ansible_host: 10.0.0.2\n")
    hosts = load_inventory(str(inv)).select(None)
    assert [(h.name, h.address, h.user, h.port, h.key, h.vars) for h in hosts] == [
        ("gpu01", "gpu01", "root", 2222, "/keys/lab", {"max_used_mib": 512}),
        ("gpu02", "10.0.0.2", "root", 2222, "/keys/lab", {"max_used_mib": 512}),
    ]


def test_an_ini_inventory_reads_its_group_vars_and_host_vars(put: Put) -> None:
    inv = put("hosts", "[training]\ngpu01\ngpu02 ansible_port=2200\n")
    put("group_vars/training", "ansible_user: ops\nansible_port: 2222\n")
    put("host_vars/gpu01.yaml", "ansible_host: 10.0.0.1\n")
    hosts = load_inventory(str(inv)).hosts
    assert (hosts["gpu01"].address, hosts["gpu01"].user, hosts["gpu01"].port) == (
        "10.0.0.1", "ops", 2222)
    # The host's own line in the inventory wins over group_vars/, as in Ansible.
    assert (hosts["gpu02"].address, hosts["gpu02"].user, hosts["gpu02"].port) == (
        "gpu02", "ops", 2200)


# Lowest first, as Ansible's variable precedence lists them. Variable vK is set at levels
# 0..K, so it must come out as level K's: every level beats the one below it.
LEVELS = ["inventory all", "inventory child", "group_vars/all", "group_vars/child",
          "inventory host", "host_vars/gpu01"]


def test_each_level_of_precedence_beats_the_one_below(put: Put) -> None:
    def at(level: int) -> dict[str, str]:
        return {f"v{k}": LEVELS[level] for k in range(level, len(LEVELS))}

    inv = put("hosts.yml", json.dumps({"all": {"vars": at(0), "children": {
        "parent": {"children": {"child": {"vars": at(1), "hosts": {"gpu01": at(4)}}}}}}}))
    put("group_vars/all.yml", json.dumps(at(2)))
    put("group_vars/child.yml", json.dumps(at(3)))
    put("host_vars/gpu01.yml", json.dumps(at(5)))
    got = load_inventory(str(inv)).hosts["gpu01"].vars
    assert got == {f"v{k}": LEVELS[k] for k in range(len(LEVELS))}


def test_group_vars_of_groups_go_by_depth_then_priority_then_name(put: Put) -> None:
    inv = put("hosts.yml", """\
all:
  children:
    parent:
      children:
        child: {hosts: {gpu01: }}
    zeta: {hosts: {gpu01: }}
    alpha: {hosts: {gpu01: }}
    low: {hosts: {gpu02: }}
    high: {hosts: {gpu02: }, vars: {ansible_group_priority: 5}}
""")
    for group in ("parent", "child", "zeta", "alpha"):
        put(f"group_vars/{group}.yml", f"depth: {group}\nsibling: {group}\n")
    put("group_vars/child.yml", "depth: child\n")
    put("group_vars/high.yml", "sibling: high\n")
    put("group_vars/low.yml", "sibling: low\n")
    hosts = load_inventory(str(inv)).hosts
    # child is deeper than parent; among depth 1, zeta sorts after alpha and parent.
    assert hosts["gpu01"].vars == {"depth": "child", "sibling": "zeta"}
    # The inventory's ansible_group_priority orders the files too.
    assert hosts["gpu02"].vars == {"sibling": "high"}


def test_group_vars_ungrouped_is_for_the_hosts_in_no_group(put: Put) -> None:
    inv = put("hosts.ini", "gpu00\n[training]\ngpu01\n")
    put("group_vars/ungrouped.yml", "ansible_user: lone\n")
    hosts = load_inventory(str(inv)).hosts
    assert (hosts["gpu00"].user, hosts["gpu01"].user) == ("lone", None)


def test_a_directory_of_files_is_merged_in_name_order(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all/10-base.yml", "a: base\nb: base\nc: base\nd: base\ne: base\n")
    put("group_vars/all/20-site.yaml", "b: site\nc: site\nd: site\ne: site\n")
    put("group_vars/all/30-more/1.json", '{"c": "nested", "d": "nested", "e": "nested"}')
    put("group_vars/all/40-plain", "d: plain\ne: plain\n")
    put("group_vars/all/50-last.yml", "e: last\n")
    # Never read: another extension, hidden, an editor's backup, a folder with an extension.
    put("group_vars/all/60-notes.txt", "e: txt\n")
    put("group_vars/all/.70-hidden.yml", "e: hidden\n")
    put("group_vars/all/80-backup.yml~", "e: backup\n")
    put("group_vars/all/90-old.d/x.yml", "e: old.d\n")
    assert load_inventory(str(inv)).hosts["gpu01"].vars == {
        "a": "base", "b": "site", "c": "nested", "d": "plain", "e": "last"}


@pytest.mark.parametrize("name", ["training", "training.yml", "training.yaml",
                                  "training.json"])
def test_each_extension_ansible_reads_is_read(put: Put, name: str) -> None:
    inv = put("hosts.yml", "training:\n  hosts:\n    gpu01:\n")
    put(f"group_vars/{name}", '{"grace": 7}')
    assert load_inventory(str(inv)).hosts["gpu01"].vars == {"grace": 7}


def test_the_first_name_ansible_looks_for_is_the_only_one_read(put: Put) -> None:
    inv = put("hosts.yml", "training:\n  hosts:\n    gpu01:\n    gpu02:\n")
    put("group_vars/training", "a: bare\n")
    put("group_vars/training.yml", "b: yml\n")  # not read: the bare name is there
    put("host_vars/gpu01/x.yml", "c: folder\n")
    put("host_vars/gpu01.yml", "d: yml\n")  # not read: the folder is there
    put("host_vars/gpu02.txt", "e: txt\n")  # not a name Ansible looks for
    hosts = load_inventory(str(inv)).hosts
    assert hosts["gpu01"].vars == {"a": "bare", "c": "folder"}
    assert hosts["gpu02"].vars == {"a": "bare"}


def test_files_for_names_the_inventory_lacks_are_not_read(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all.yml", "grace: 3\n")
    put("group_vars/databases.yml", "- not: read\n  : at all\n")
    put("host_vars/gpu99.yml", "{broken\n")
    assert load_inventory(str(inv)).hosts["gpu01"].vars == {"grace": 3}


def test_a_json_file_indented_with_tabs_is_read(put: Put) -> None:
    # YAML refuses a tab before a token; JSON allows it, and Ansible reads JSON first.
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all.json", '{\n\t"ansible_user": "root"\n}\n')
    assert load_inventory(str(inv)).hosts["gpu01"].user == "root"


def test_a_vault_file_is_skipped_with_a_warning_naming_it(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all/10-plain.yml", "ansible_user: root\n")
    vault = put("group_vars/all/20-vault.yml", VAULT_FILE)
    loaded = load_inventory(str(inv))
    assert loaded.hosts["gpu01"].user == "root"
    assert loaded.warnings == (
        f"{vault} is encrypted with Ansible Vault, which fleetclean cannot decrypt: not read "
        "(set what fleetclean needs from it in a file that is not encrypted)",)


def test_a_vault_value_is_left_unset_with_a_warning(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    path = put("host_vars/gpu01.yml", f"ansible_user: root\ndb_password: {VAULT_VALUE}"
               "grace: 4\n")
    loaded = load_inventory(str(inv))
    host = loaded.hosts["gpu01"]
    assert (host.user, host.vars) == ("root", {"grace": 4})
    assert loaded.warnings == (
        f"{path}:2: db_password is encrypted with '!vault', which fleetclean cannot "
        "decrypt: left unset",)


def test_bad_yaml_in_group_vars_is_one_line_naming_the_file_and_exit_4(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    path = put("group_vars/all.yml", "ansible_user: root\ngrace: {5\n")
    want = (f"{path}:3:1: not valid YAML: expected ',' or '}}', but got '<stream end>' "
            "(close the '{' or '[' opened at line 2)")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(inv))
    assert str(caught.value) == want
    code, out, err = run_cli("inventory", "-i", str(inv))
    assert (code, out, err) == (4, "", f"fleetclean: error: {want}\n")


def test_a_vars_file_that_is_not_a_mapping_is_an_error(put: Put) -> None:
    inv = put("hosts.ini", "gpu01\n")
    path = put("host_vars/gpu01", "- ansible_user: root\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(inv))
    assert str(caught.value) == (
        f"{path}:1:1: a variables file is a mapping of names to values, got a list "
        "(write one 'name: value' a line)")


def test_a_bad_value_from_group_vars_names_that_file(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    path = put("group_vars/all.yml", "ansible_user: root\nansible_port: ssh\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(str(inv))
    assert str(caught.value) == (
        f"{path}:2:15: ansible_port must be a whole number from 1 to 65535, got 'ssh' "
        "(e.g. ansible_port: 22)")


def test_an_unreadable_vars_file_is_one_line_and_exit_4(
    put: Put, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    path = put("group_vars/all.yml", "ansible_user: root\n")
    real_open = builtins.open

    def refusing(file: Any, *args: Any, **kwargs: Any) -> Any:
        # chmod 000 stops no one running as root (the test machines): refuse by hand.
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    code, out, err = run_cli("inventory", "-i", str(inv))
    assert (code, out, err) == (4, "", f"fleetclean: error: {path}: cannot read variables file: "
                                "Permission denied (give yourself read permission on it "
                                "(chmod u+r), or remove it)\n")


def test_each_inventory_file_has_its_own_dirs_and_the_later_one_wins(
    put: Put, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = put("a/hosts.yml", "training:\n  hosts:\n    gpu01:\n")
    second = put("b/hosts.yml", "all:\n  hosts:\n    gpu02:\n")
    put("a/group_vars/training.yml", "ansible_user: from_a_training\n")
    put("a/group_vars/all.yml", "ansible_port: 2201\ngrace: 1\n")
    put("b/group_vars/all.yml", "ansible_user: from_b_all\ngrace: 2\n")
    hosts = load_inventory([str(first), str(second)]).hosts
    # Every group_vars/all (b's last) first, then the other groups' files: as Ansible.
    assert (hosts["gpu01"].user, hosts["gpu01"].port, hosts["gpu01"].vars) == (
        "from_a_training", 2201, {"grace": 2})
    assert (hosts["gpu02"].user, hosts["gpu02"].port) == ("from_b_all", 2201)
    # A host list has no directory: group_vars/ in the working directory is not its.
    put("group_vars/all.yml", "ansible_user: cwd\n")
    monkeypatch.chdir(tmp_path)
    assert load_inventory("gpu03,").hosts["gpu03"].user is None
    assert load_inventory([str(first), "gpu03,"]).hosts["gpu03"].user is None


def test_an_ssh_config_given_with_F_in_group_vars_is_the_inventorys(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    config = put("lab_ssh_config", "Host gpu01\n  HostName 10.9.9.9\n")
    put("group_vars/all.yml", "ansible_ssh_common_args: -F lab_ssh_config\n")
    host = load_inventory(str(inv)).hosts["gpu01"]
    assert (host.ssh_config, host.address) == (str(config), "10.9.9.9")


def test_group_vars_that_is_a_file_is_said_and_skipped(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars", "ansible_user: root\n")
    loaded = load_inventory(str(inv))
    assert loaded.hosts["gpu01"].user is None
    assert loaded.warnings == (
        f"{inv.parent / 'group_vars'} is not a directory: not read (Ansible skips it too)",)


def test_inventory_json_shows_what_group_vars_set(put: Put) -> None:
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all.yml", "ansible_user: root\nmax_used_mib: 256\n")
    code, out, err = run_cli("inventory", "-i", str(inv), "--json")
    (host,) = json.loads(out)["hosts"]
    assert (code, err, host["user"], host["vars"]) == (0, "", "root", {"max_used_mib": 256})


def test_a_template_of_variables_is_rendered_and_any_other_left_unset_and_said(
    put: Put,
) -> None:
    # group_vars/ is where templates live. `{{ inventory_hostname }}.ib` (every node's
    # InfiniBand name) and `{{ admin_user }}` with admin_user set are what Ansible renders
    # from the host's variables; fleetclean left them unset, and reached gpu02 by its
    # inventory name and as the local user. A filter, or a variable the host lacks, is
    # still left unset and said: its text is no host or user.
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01: {ansible_host: 10.0.0.1}\n"
              "    gpu02:\n    gpu03: {admin_user: null}\n")
    put("group_vars/all.yml", 'ansible_user: "{{ admin_user }}"\nadmin_user: ops\n'
        'ansible_host: "{{ inventory_hostname }}.ib"\n'
        'ansible_ssh_common_args: "{{ ib_args | regex_replace(\'x\', \'\') }}"\n'
        'ansible_python_interpreter: "{{ ansible_playbook_python }}"\n')
    inventory = load_inventory(str(inv))
    hosts = inventory.hosts
    assert [(h.address, h.user, h.port) for h in hosts.values()] == [
        ("10.0.0.1", "ops", 22), ("gpu02.ib", "ops", 22), ("gpu03.ib", None, 22)]
    said = [w for w in inventory.warnings if "Jinja template" in w]
    assert len(said) == 2 and all("group_vars/all.yml:" in w for w in said)
    (port,) = (w for w in said if "ansible_ssh_common_args" in w)
    (user,) = (w for w in said if "ansible_user" in w)
    assert "uses the filter regex_replace, which fleetclean does not render" in port
    assert "admin_user is not set" in user


def test_a_name_no_variable_can_have_is_left_out_of_a_vars_file(put: Put) -> None:
    # Ansible reads such a file unchecked: refusing it stopped a run that Ansible makes.
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all.yml", "nginx-port: 80\nansible_user: ops\n")
    put("group_vars/ungrouped.json", '{"odd key": 1, "ansible_port": 2201}')
    inventory = load_inventory(str(inv))
    host = inventory.hosts["gpu01"]
    assert (host.user, host.port, host.vars) == ("ops", 2201, {})
    assert any("group_vars/all.yml:1: 'nginx-port'" in w for w in inventory.warnings)
    assert any("'odd key'" in w for w in inventory.warnings)


def test_force_from_a_vars_file_is_said(put: Put) -> None:
    # A `force` written for another tool's role would pass fleetclean's guard on every run.
    inv = put("hosts.yml", "all:\n  hosts:\n    gpu01:\n")
    put("group_vars/all.yml", "ansible_user: ops\nforce: true\n")
    said = [w for w in load_inventory(str(inv)).warnings if "force is set" in w]
    assert len(said) == 1 and "group_vars/all.yml:2" in said[0]
    for off in ("false", "'Off'", "'0'"):  # as a run reads them (engine/checks.py boolean)
        put("group_vars/all.yml", f"ansible_user: ops\nforce: {off}\n")
        assert not [w for w in load_inventory(str(inv)).warnings if "force is set" in w]


def test_the_connection_specific_name_wins_across_levels_as_in_ansible(put: Put) -> None:
    # group_vars/all's ansible_ssh_user beat nothing: it was folded into ansible_user at its
    # own level, where host_vars' ansible_user then won. Ansible connects as deploy.
    inventory = put("hosts.ini", "[gpus]\ngpu01\ngpu02 ansible_ssh_port=2202 ansible_port=2200\n")
    put("group_vars/all.yml", "ansible_ssh_user: deploy\n"
        "ansible_ssh_private_key_file: /keys/site\n")
    put("host_vars/gpu01.yml", "ansible_user: root\nansible_private_key_file: /keys/own\n")
    hosts = load_inventory(inventory).hosts
    assert (hosts["gpu01"].user, hosts["gpu01"].key) == ("deploy", "/keys/site")
    assert hosts["gpu02"].port == 2202


def test_a_null_alias_leaves_the_other_name_and_sudo_pass_is_read(put: Put) -> None:
    # Ansible skips a null (its config manager takes the last name whose value is set):
    # a null ansible_ssh_user wiped the host's ansible_user. ansible_sudo_pass, which
    # Ansible's sudo plugin ranks above both other names, was never read.
    inventory = put("hosts.ini", "gpu01 ansible_user=root\n")
    put("group_vars/all.yml", "ansible_ssh_user: null\nansible_become_password: old\n"
        "ansible_sudo_pass: newer\n")
    (inventory.parent / "group_vars" / "all.yml").chmod(0o600)
    host = load_inventory(inventory).hosts["gpu01"]
    assert host.user == "root"
    assert host.become_password is not None and host.become_password.reveal() == "newer"


def test_what_a_password_template_reads_is_a_secret_and_never_shown(put: Put) -> None:
    # ansible_become_password: "{{ sudo_pw }}" renders now; sudo_pw was then a playbook
    # variable that `inventory --json` printed, and a template that did not render was
    # said with its text (a password with "{#" in it, in the warning).
    inv = put("hosts.ini", "[gpus]\ngpu01\ngpu02\n")
    put("group_vars/all.yml", 'ansible_become_password: "{{ sudo_pw }}"\n'
        "sudo_pw: 'S3cret!'\nmax_used_mib: 64\n")
    put("host_vars/gpu02.yml", "sudo_pw: 'Xk{#9!p'\n")
    inventory = load_inventory(str(inv))
    gpu01, gpu02 = inventory.hosts["gpu01"], inventory.hosts["gpu02"]
    assert gpu01.become_password is not None and gpu01.become_password.reveal() == "S3cret!"
    assert gpu02.become_password is None  # "{#" reads as Jinja: not rendered, left unset
    assert gpu01.vars == gpu02.vars == {"max_used_mib": 64}
    said = "\n".join(inventory.warnings)
    assert "S3cret" not in said and "Xk{#9" not in said
    assert "group_vars/all.yml holds ansible_become_password and is readable" in said
    code, out, _ = run_cli("inventory", "-i", str(inv), "--json")
    assert code == 0 and "S3cret" not in out and "sudo_pw" not in out
