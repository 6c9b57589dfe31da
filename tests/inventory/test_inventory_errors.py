"""Every wrong inventory gives one line: file:line:col: what is wrong (how to fix it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory

DATA = Path(__file__).resolve().parents[1] / "data" / "inventories"
INVENTORIES = Path(__file__).resolve().parents[2] / "inventories"

BAD = DATA / "bad"

# file under tests/data/inventories/bad/ -> the exact message after "path"
CASES = {
    "unclosed_flow.yml": ":4:10: not valid YAML: expected ',' or '}', but got ':' "
    "(close the '{' or '[' opened at line 3)",
    "tab_indent.yml": ":2:1: not valid YAML: found character '\\t' that cannot start any token "
    "(indent with spaces, not tabs)",
    "two_documents.yml": ":4:1: not valid YAML: expected a single document in the stream, but "
    "found another document (keep one document: remove the second '---')",
    "list_at_top.yml": ":1:1: an inventory is a mapping of groups, got a list "
    "(start the file with 'all:')",
    "text_at_top.yml": ":1:1: an inventory is a mapping of groups, got 'gpu01.lab' "
    "(start the file with 'all:')",
    "hosts_at_top.yml": ":1:1: 'hosts:' at the top level must sit inside a group "
    "(indent it under 'all:')",
    "hosts_as_list.yml": ":3:5: 'hosts' of group 'all' must be a mapping, got a list "
    "(write each host as 'gpu01:' on its own line, not '- gpu01')",
    "childern_misspelt.yml": ":2:3: unknown key 'childern' in group 'all' "
    "(did you mean 'children'?)",
    "unknown_group_key.yml": ":4:3: unknown key 'members' in group 'all' "
    "(a group holds only 'hosts:', 'children:' and 'vars:')",
    "group_as_list.yml": ":4:7: group 'training' must be a mapping of hosts, children and vars, "
    "got a list (give it 'hosts:', 'children:' or 'vars:' keys)",
    "vars_as_list.yml": ":3:5: variables of group 'all' must be a mapping, got a list "
    "(write 'key: value' lines)",
    "host_as_address.yml": ":3:12: host 'gpu01' must map to its variables or to nothing, "
    "got '10.0.0.1' (write 'gpu01: {ansible_host: 10.0.0.1}')",
    "duplicate_key.yml": ":4:3: duplicate key 'hosts' (first at line 2) "
    "(merge the two entries into one)",
    "group_loop.yml": ":8:9: group 'a' would contain itself through 'b' "
    "(remove one of the children: entries that form the loop)",
    "all_as_child.yml": ":5:9: group 'all' cannot be a child of 'training' "
    "('all' holds every group already)",
    "bad_variable_name.yml": ":3:5: 'max-used-mib' is not a valid variable name "
    "(use letters, digits and underscores, e.g. 'max_used_mib')",
    "range_backwards.yml": ":3:8: host range 'gpu[10:01].lab' runs backwards "
    "(10 comes after 01) (write [01:10])",
    "range_bad_end.yml": ":3:8: host range 'gpu[01:xx].lab' has a bad end 'xx' "
    "(use numbers as in [01:16] or single letters of one case as in [a:f])",
    "range_mixed.yml": ":3:9: host range 'node[1:f]' has a bad end 'f' "
    "(use numbers as in [01:16] or single letters of one case as in [a:f])",
    "range_width.yml": ":3:8: host range 'gpu[01:100]' pads start '01' to 2 digits but end "
    "'100' has 3 (write both ends with the same number of digits, e.g. [001:100])",
    "range_step_zero.yml": ":3:8: host range 'gpu[1:9:0]' has a bad step '0' "
    "(the step is a whole number of at least 1, as in [1:9:2])",
    "range_unclosed.yml": ":3:8: host range 'gpu[01:04' has an unclosed '[' "
    "(close it, e.g. gpu[01:08])",
    "range_no_colon.yml": ":3:8: host range 'gpu[1]' needs start:end or start:end:step "
    "inside '[...]' (write gpu[01:08] or gpu[1:9:2])",
    "host_suffix_port.yml": ":3:5: host 'gpu01:99999' has a bad port '99999' "
    "(write name:PORT with PORT from 1 to 65535)",
    "port_out_of_range.yml": ":4:21: ansible_port must be a whole number from 1 to 65535, "
    "got 70000 (e.g. ansible_port: 22)",
    "port_not_a_number.yml": ":3:19: ansible_port must be a whole number from 1 to 65535, "
    "got 'ssh' (e.g. ansible_port: 22)",
    "port_boolean.yml": ":3:31: ansible_port must be a whole number from 1 to 65535, "
    "got True (e.g. ansible_port: 22)",
    "conflicting_ansible_host.yml": ":8:31: host 'gpu01' has ansible_host '10.0.0.2' here but "
    "'10.0.0.1' at line 5 (give each host its connection variables in one place)",
    "connection_telnet.yml": ":4:27: ansible_connection 'telnet' is not supported "
    "(use 'ssh' or 'local')",
    "become_maybe.yml": ":4:23: ansible_become must be yes/no/true/false, got 'maybe' "
    "(e.g. ansible_become: yes)",
    "ansible_host_list.yml": ":4:21: ansible_host must be text, got ['10.0.0.1', '10.0.0.2'] "
    "(write ansible_host: VALUE on one line)",
    "group_priority_words.yml": ":5:33: ansible_group_priority of group 'training' must be a "
    "whole number, got 'high' (e.g. ansible_group_priority: 10)",
    "ssh_args_unclosed_quote.yml": ":3:30: ansible_ssh_common_args: cannot split ssh "
    "arguments: No closing quotation (close the quote or drop it)",
    "ssh_args_dangling_o.yml": ":4:31: ansible_ssh_extra_args: '-o' at the end of the ssh "
    "arguments has no option (write -o Key=Value)",
    "ssh_args_missing_F.yml": f":3:30: ssh config file '{BAD / 'no_such_ssh_config'}' given "
    "by -F does not exist (fix the -F path or remove it)",
    "python_tag.yml": ":3:11: YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is "
    "not allowed (inventories hold plain values; remove the tag)",
    "vault_value.yml": ":3:12: encrypted '!vault' values cannot be read "
    "(decrypt the value or pass it with -e)",
    "empty.yml": ": inventory file is empty (add 'all:' with 'hosts:')",
    "comments_only.yml": ": inventory file is empty (add 'all:' with 'hosts:')",
    "no_hosts.yml": ": inventory defines no hosts "
    "(list hosts under a group's 'hosts:' in YAML or in a [group] section in INI)",
    "not_utf8.yml": ":3:8: not UTF-8 text (byte 0xff) (save the file as UTF-8)",
    "unknown_section.ini": ":4:1: unknown section type ':chidren' (did you mean ':children'?)",
    "host_word_not_key_value.ini": ":2:7: expected key=value after host 'gpu01', got "
    "'ansible_host' (write variables as key=value, quoting values with spaces)",
    "undefined_child.ini": ":5:1: group 'h200s' is never defined but is listed as a child "
    "(add a [h200s] section, even an empty one)",
    "vars_for_undefined_group.ini": ":4:1: group 'gpu' is never defined but has a [vars] "
    "section (add a [gpu] section, even an empty one)",
    "vars_line_without_equals.ini": ":5:1: expected key=value, got 'max_used_mib 512' "
    "(a [group:vars] section holds key=value lines)",
    "children_two_per_line.ini": ":6:1: [gpus:children] lists one group a line, got 'a b' "
    "(put each child group on its own line)",
    "unclosed_quote.ini": ":2:1: cannot read line: No closing quotation (close the quote)",
    "range_backwards.ini": ":2:4: host range 'gpu[08:01]' runs backwards (08 comes after 01) "
    "(write [01:08])",
    "port_zero.ini": ":2:7: ansible_port must be a whole number from 1 to 65535, got 0 "
    "(e.g. ansible_port: 22)",
    "telnet_no_extension": ":2:7: ansible_connection 'telnet' is not supported "
    "(use 'ssh' or 'local')",
    # Taken for hosts, these failed only when SSH could not resolve their names.
    "variable_before_any_section.ini": ":1:1: 'ansible_user=root' is a variable where a host "
    "name goes (put variables after a host on its line, or under [GROUP:vars] (in YAML, "
    "under vars:))",
    "variable_under_hosts.ini": ":3:1: 'max_used_mib=512' is a variable where a host name goes "
    "(put variables after a host on its line, or under [GROUP:vars] (in YAML, under vars:))",
    "blank_in_host_name.yml": ":3:5: host name 'gpu 01' has a blank or control character "
    "(write one host name a line, without blanks)",
}


def test_every_bad_file_has_an_expected_message() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_inventory_gives_one_exact_line(name: str) -> None:
    path = str(BAD / name)
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == path + CASES[name]
    assert "\n" not in str(caught.value)


def test_missing_file_names_it(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yml")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert str(caught.value) == (
        f"{path}: inventory file does not exist (check the path given to -i)"
    )


def test_directory_given_as_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path}: is a directory, not an inventory file "
        "(give the inventory file inside it, e.g. -i inventories/lab.yml)"
    )


def test_given_ssh_config_that_is_missing(write: Callable[[str, str], Path]) -> None:
    path = write("lab.yml", "all:\n  hosts:\n    gpu01:\n")
    missing = str(path.parent / "ssh_config")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path, ssh_config=missing)
    assert str(caught.value) == (
        f"{missing}: ssh config file does not exist (fix the path or remove it)"
    )


def test_env_ssh_config_that_is_missing(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write("lab.yml", "all:\n  hosts:\n    gpu01:\n")
    missing = str(path.parent / "env_config")
    monkeypatch.setenv("FLEETCLEAN_SSH_CONFIG", missing)
    with pytest.raises(InventoryError, match="ssh config file does not exist"):
        load_inventory(path)


def test_unparsable_ssh_config(write: Callable[[str, str], Path]) -> None:
    path = write("lab.yml", "all:\n  hosts:\n    gpu01:\n")
    config = write("ssh_config", "Host gpu01\n  Port abc\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path, ssh_config=config)
    assert str(caught.value) == (
        f"{config}: Port 'abc' for host 'gpu01' is not a port number (use a number from 1 to 65535)"
    )


@pytest.mark.parametrize(("inventory", "config", "words"), [
    # str.isdigit takes "²", which int() then refused with a traceback, in each of the
    # three places a port is read.
    ("all:\n  hosts:\n    gpu01: {ansible_port: '²'}\n", "",
     "ansible_port must be a whole number from 1 to 65535, got '²'"),
    ("all:\n  hosts:\n    gpu01: {ansible_ssh_common_args: -p ²}\n", "",
     "port '²' in the ssh arguments is not a port number"),
    ("all:\n  hosts:\n    gpu01:\n", "Host gpu01\n  Port ²\n",
     "Port '²' for host 'gpu01' is not a port number"),
])
def test_a_port_in_other_digits_is_an_error_not_a_traceback(
    write: Callable[[str, str], Path], inventory: str, config: str, words: str
) -> None:
    path = write("lab.yml", inventory)
    with pytest.raises(InventoryError, match=words):
        load_inventory(path, ssh_config=write("ssh_config", config) if config else "")


def test_limit_that_selects_nothing_names_the_pattern() -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    with pytest.raises(InventoryError) as caught:
        inventory.select("gpu99.lab")
    assert str(caught.value) == (
        f"{inventory.path}: --limit 'gpu99.lab' selects no host "
        "('gpu99.lab' matches no host or group name; did you mean 'gpu08.lab'?)"
    )


def test_limit_emptied_by_exclusion() -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    with pytest.raises(InventoryError) as caught:
        inventory.select("canary:!training")
    assert str(caught.value) == (
        f"{inventory.path}: --limit 'canary:!training' selects no host "
        "(the hosts it names are all removed again by its '&' or '!' terms)"
    )


def test_limit_file_missing(tmp_path: Path) -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    missing = tmp_path / "retry.txt"
    with pytest.raises(InventoryError) as caught:
        inventory.select(f"@{missing}")
    assert str(caught.value) == (
        f"{inventory.path}: --limit file '{missing}' does not exist "
        "(write @FILE with one host pattern per line)"
    )


def test_limit_bad_range_and_bad_regex() -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    with pytest.raises(InventoryError) as caught:
        inventory.select("gpu[04:01].lab")
    assert str(caught.value) == (
        f"{inventory.path}: --limit 'gpu[04:01].lab': host range 'gpu[04:01].lab' runs "
        "backwards (04 comes after 01) (write [01:04])"
    )
    with pytest.raises(InventoryError) as caught:
        inventory.select("~gpu(")
    assert str(caught.value) == (
        f"{inventory.path}: --limit '~gpu(' has a bad regular expression 'gpu(': missing ), "
        "unterminated subpattern at position 3 (fix the expression after '~')"
    )


def test_user_at_host_is_the_host_with_its_ansible_user() -> None:
    # As ssh and pdsh take it; it was a host named "root@..." that no resolver knew.
    inventory = load_inventory("root@gpu01.lab,alice@gpu[02:03].lab,")
    assert [(h.name, h.user) for h in inventory.select(None)] == [
        ("gpu01.lab", "root"), ("gpu02.lab", "alice"), ("gpu03.lab", "alice")]
    assert [h.name for h in inventory.select("alice@gpu02.lab")] == ["gpu02.lab"]


def test_a_given_user_wins_over_the_one_before_the_at(tmp_path: Path) -> None:
    ini = tmp_path / "i.ini"
    ini.write_text("carol@gpu04 ansible_ssh_user=dave\n")
    assert [h.user for h in load_inventory(str(ini)).select(None)] == ["dave"]

