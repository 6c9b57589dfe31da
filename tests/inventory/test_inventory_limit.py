"""--limit: Ansible's pattern language, and its set algebra over generated inventories."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetclean.errors import InventoryError
from fleetclean.inventory import load_inventory
from fleetclean.inventory.limit import select_names, split_terms

INVENTORIES = Path(__file__).resolve().parents[2] / "inventories"

HOSTS = [f"h{i:02d}" for i in range(12)]
GROUP_NAMES = ["ga", "gb", "gc", "gd"]


@st.composite
def inventories(draw: st.DrawFn) -> dict[str, tuple[str, ...]]:
    groups: dict[str, tuple[str, ...]] = {"all": tuple(HOSTS)}
    for name in GROUP_NAMES:
        members = draw(st.sets(st.sampled_from(HOSTS)))
        groups[name] = tuple(h for h in HOSTS if h in members)
    return groups


def pick(limit: str, groups: dict[str, tuple[str, ...]]) -> set[str]:
    try:
        return set(select_names(limit, HOSTS, groups))
    except InventoryError:
        return set()


two_groups = st.tuples(st.sampled_from(GROUP_NAMES), st.sampled_from(GROUP_NAMES))


@given(inventories(), two_groups, st.sampled_from([":", ","]))
def test_union_is_set_union(
    groups: dict[str, tuple[str, ...]], ab: tuple[str, str], sep: str
) -> None:
    a, b = ab
    assert pick(f"{a}{sep}{b}", groups) == set(groups[a]) | set(groups[b])


@given(inventories(), two_groups)
def test_intersection_is_set_intersection(
    groups: dict[str, tuple[str, ...]], ab: tuple[str, str]
) -> None:
    a, b = ab
    assert pick(f"{a}:&{b}", groups) == set(groups[a]) & set(groups[b])


@given(inventories(), two_groups)
def test_exclusion_is_set_difference(
    groups: dict[str, tuple[str, ...]], ab: tuple[str, str]
) -> None:
    a, b = ab
    assert pick(f"{a}:!{b}", groups) == set(groups[a]) - set(groups[b])
    assert pick(f"!{b}", groups) == set(HOSTS) - set(groups[b])


@given(inventories(), st.permutations(["ga", "&gb", "!gc", "gd"]))
def test_term_order_does_not_matter(groups: dict[str, tuple[str, ...]], terms: list[str]) -> None:
    expected = ((set(groups["ga"]) | set(groups["gd"])) & set(groups["gb"])) - set(groups["gc"])
    assert pick(":".join(terms), groups) == expected


@given(inventories(), st.sampled_from(GROUP_NAMES))
def test_selection_keeps_inventory_order(groups: dict[str, tuple[str, ...]], g: str) -> None:
    if groups[g]:
        assert select_names(f"{g}:all", HOSTS, groups) == HOSTS


@pytest.fixture
def lab() -> list[str]:
    return list(load_inventory(INVENTORIES / "lab.yml").hosts)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, 16),
        ("", 16),
        ("all", 16),
        ("*", 16),
        ("training", 8),
        ("gpu01.lab", ["gpu01.lab"]),
        ("gpu0[1-3]*", ["gpu01.lab", "gpu02.lab", "gpu03.lab"]),
        ("gpu[02:04].lab", ["gpu02.lab", "gpu03.lab", "gpu04.lab"]),
        ("gpu[1:8:3]*", []),  # no host is called gpu1.lab: unpadded range
        ("gpu[01:08:3].lab", ["gpu01.lab", "gpu04.lab", "gpu07.lab"]),
        ("training[0:1]", ["h200-01.lab", "h200-02.lab"]),
        ("training[-1]", ["h200-08.lab"]),
        ("extraction[6:]", ["gpu07.lab", "gpu08.lab"]),
        ("~h200-0[12]", ["h200-01.lab", "h200-02.lab"]),
        ("~can", ["h200-08.lab"]),
        ("training:!canary", 7),
        ("training,extraction:&canary", ["h200-08.lab"]),
        ("gpu01.lab,gpu02.lab", ["gpu01.lab", "gpu02.lab"]),
        ("&canary", ["h200-08.lab"]),
    ],
)
def test_lab_patterns(limit: str | None, expected: int | list[str]) -> None:
    inventory = load_inventory(INVENTORIES / "lab.yml")
    if expected == []:
        with pytest.raises(InventoryError, match="selects no host"):
            inventory.select(limit)
        return
    names = [h.name for h in inventory.select(limit)]
    if isinstance(expected, int):
        assert len(names) == expected
    else:
        assert names == expected


def test_limit_file_one_pattern_per_line(tmp_path: Path) -> None:
    retry = tmp_path / "retry"
    retry.write_text("# failed last time\ngpu03.lab\n\nh200-0[12]*\n", encoding="utf-8")
    inventory = load_inventory(INVENTORIES / "lab.yml")
    names = [h.name for h in inventory.select(f"@{retry}")]
    assert names == ["gpu03.lab", "h200-01.lab", "h200-02.lab"]
    assert [h.name for h in inventory.select(f"training:!@{retry}")][:1] == ["h200-03.lab"]


def test_split_terms_keeps_range_colons() -> None:
    assert split_terms("gpu[01:04]:training,!canary") == ["gpu[01:04]", "training", "!canary"]
    assert split_terms("~gpu{1,2}:x") == ["~gpu{1,2}", "x"]


@pytest.mark.parametrize(("limit", "says"), [
    (",", "holds no host pattern"),
    ("@EMPTY", "holds no host pattern"),
    ("all:!", "with no pattern after it"),
    ("gpu01.lab:gpu99.lab", "'gpu99.lab' matches no host or group name"),
    # A typo in an exclusion would have run on the very host it was written to spare.
    ("all:!h200-08.lba", "did you mean 'h200-08.lab'"),
])
def test_a_limit_that_names_nothing_or_a_typo_selects_no_host(
    tmp_path: Path, limit: str, says: str
) -> None:
    empty = tmp_path / "retry"
    empty.write_text("# nothing failed\n\n", encoding="utf-8")
    inventory = load_inventory(INVENTORIES / "lab.yml")
    with pytest.raises(InventoryError) as raised:
        inventory.select(limit.replace("EMPTY", str(empty)))
    assert says in str(raised.value), raised.value


def test_a_node_set_as_the_table_folds_it_is_those_hosts_not_a_glob() -> None:
    # The table prints node[10-12]; as a glob, [10-12] is one character of 1, 0-1 or 2,
    # and a pasted limit selected node0, node1 and node2.
    hosts = [f"node{i}" for i in range(13)]
    groups = {"all": tuple(hosts)}
    assert select_names("node[10-12]", hosts, groups) == ["node10", "node11", "node12"]
    assert select_names("node[1-2,12]", hosts, groups) == ["node1", "node2", "node12"]
    assert select_names("node1?", hosts, groups) == ["node10", "node11", "node12"]  # a glob
