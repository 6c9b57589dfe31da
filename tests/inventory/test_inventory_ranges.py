"""Host ranges: count, padding, order, stride, and as_patterns() as expand()'s inverse."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetclean.inventory.ranges import RangeError, as_patterns, expand

affix = st.text(alphabet="abcxyz-.", max_size=4)


@given(
    head=affix.filter(lambda s: not s[-1:].isdigit()),
    tail=affix,
    bounds=st.tuples(st.integers(0, 300), st.integers(0, 40)),
    step=st.integers(1, 7),
    width=st.integers(1, 4),
)
def test_number_range_count_padding_order_and_stride(
    head: str, tail: str, bounds: tuple[int, int], step: int, width: int
) -> None:
    start, length = bounds
    end = start + length
    padded_width = max(width, len(str(end)))
    first = str(start).zfill(padded_width)
    last = str(end).zfill(padded_width)
    names = expand(f"{head}[{first}:{last}:{step}]{tail}")
    numbers = list(range(start, end + 1, step))
    assert len(names) == len(numbers)
    padded = first.startswith("0") and len(first) > 1
    assert names == [f"{head}{str(n).zfill(padded_width if padded else 0)}{tail}" for n in numbers]


@given(start=st.sampled_from("abcdefghij"), length=st.integers(0, 10), step=st.integers(1, 3))
def test_letter_range_runs_through_the_alphabet(start: str, length: int, step: int) -> None:
    end = chr(ord(start) + length)
    names = expand(f"node[{start}:{end}:{step}]")
    assert names == [f"node{chr(c)}" for c in range(ord(start), ord(end) + 1, step)]


@given(a=st.integers(1, 5), b=st.integers(1, 5))
def test_two_ranges_multiply_left_range_outermost(a: int, b: int) -> None:
    names = expand(f"rack[1:{a}]-gpu[1:{b}]")
    assert len(names) == a * b
    assert names == [f"rack{i}-gpu{j}" for i in range(1, a + 1) for j in range(1, b + 1)]


name_numbers = st.lists(
    st.tuples(st.sampled_from(["gpu", "h200-", "node"]), st.integers(0, 120), st.booleans()),
    max_size=40,
)


@given(name_numbers)
def test_patterns_of_the_fold_expand_back_to_the_same_names(
    parts: list[tuple[str, int, bool]],
) -> None:
    names = [f"{head}{n:03d}.lab" if pad else f"{head}{n}.lab" for head, n, pad in parts]
    folded = as_patterns(names)
    expanded = [name for pattern in folded for name in expand(pattern)]
    assert sorted(expanded) == sorted(set(names))
    assert len(folded) <= len(set(names))


def test_known_examples() -> None:
    assert expand("gpu[01:16].lab")[::5] == ["gpu01.lab", "gpu06.lab", "gpu11.lab", "gpu16.lab"]
    assert expand("node[a:f]") == [f"node{c}" for c in "abcdef"]
    assert expand("x[1:9:2]") == ["x1", "x3", "x5", "x7", "x9"]
    assert expand("x[:2]") == ["x0", "x1", "x2"]
    assert expand("plain.lab") == ["plain.lab"]
    assert as_patterns([*expand("gpu[01:08].lab"), "login"]) == ["gpu[01:08].lab", "login"]
    assert as_patterns(["gpu9", "gpu10", "gpu09"]) == ["gpu9", "gpu[09:10]"]


@pytest.mark.parametrize(
    "pattern", ["gpu[10:01]", "gpu[01:xx]", "gpu[1]", "gpu[1:2", "gpu]", "a[[1:2]]", "n[a:Z]"]
)
def test_bad_ranges_raise(pattern: str) -> None:
    with pytest.raises(RangeError):
        expand(pattern)
