from hypothesis import given
from hypothesis import strategies as st

from fleetclean.nodeset import fold


def test_consecutive_padded_names_fold_into_one_range() -> None:
    assert fold([f"gpu{i:02d}" for i in range(1, 15)]) == "gpu[01-14]"


def test_gaps_and_plain_names_are_kept() -> None:
    assert fold(["gpu01", "gpu02", "gpu03", "gpu05", "login"]) == "gpu[01-03,05],login"


def test_different_padding_never_folds_together() -> None:
    assert fold(["n10", "n010", "n11"]) == "n[10-11],n010"


def test_suffix_after_the_number_is_kept() -> None:
    assert fold(["gpu01.lab", "gpu02.lab"]) == "gpu[01-02].lab"


def _expand(folded: str) -> set[str]:
    import re

    out: set[str] = set()
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,]*)?", folded):
        m = re.match(r"^(.*)\[(.*)\](.*)$", part)
        if not m:
            out.add(part)
            continue
        pre, body, suf = m.groups()
        for r in body.split(","):
            a, _, b = r.partition("-")
            width = len(a)
            for n in range(int(a), int(b or a) + 1):
                out.add(f"{pre}{n:0{width}d}{suf}")
    return out


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_folding_names_exactly_the_hosts_given(numbers: set[int]) -> None:
    names = [f"node{n:03d}" for n in sorted(numbers)]
    assert _expand(fold(names)) == set(names)
