"""The workers take the suite's groups longest first (tests/longest_first.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import longest_first


@dataclasses.dataclass
class Item:
    """What longest_first reads of a pytest item: its id and its xdist group."""

    nodeid: str
    group: str | None = None
    also: str | None = None  # a second xdist_group mark

    def iter_markers(self, name: str):
        names = [g for g in (self.group, self.also) if g] if name == "xdist_group" else []
        return iter([pytest.mark.xdist_group(g).mark for g in names])


def test_groups_are_ordered_by_their_total_seconds_and_stay_together_in_pytests_order():
    items = [
        Item("a.py::t1", "a.py()"), Item("a.py::t2", "a.py()"),
        Item("b.py::alone"),
        Item("c.py::t1[x]", "c.py(p=x)"), Item("c.py::t2[x]", "c.py(p=x)"),
        Item("d.py::unknown"),
    ]
    seconds = {"a.py::t1": 3.0, "a.py::t2": 3.0, "b.py::alone": 100.0, "c.py::t1[x]": 10.0, "c.py::t2[x]": 0.1}
    ordered = [item.nodeid for item in longest_first.longest_first(items, seconds)]
    assert ordered == ["b.py::alone", "c.py::t1[x]", "c.py::t2[x]", "a.py::t1", "a.py::t2", "d.py::unknown"]


def test_a_test_of_two_groups_goes_with_the_tests_of_the_same_two_as_xdist_runs_them():
    items = [Item("a.py::t1", "a", "b"), Item("a.py::t2", "a"), Item("z.py::long"), Item("a.py::t3", "b", "a")]
    ordered = [item.nodeid for item in longest_first.longest_first(items, {"z.py::long": 9.0, "a.py::t1": 5.0})]
    assert ordered == ["z.py::long", "a.py::t1", "a.py::t3", "a.py::t2"]


def test_unknown_tests_keep_the_collection_order():
    items = [Item(f"t.py::test_{n}") for n in range(5)]
    assert longest_first.longest_first(items, {}) == items


@pytest.mark.parametrize(("nodeid", "plain"), [
    ("t.py::test_a@t.py(isolation=bwrap)", "t.py::test_a"),
    ("t.py::test_a[bwrap]@t.py(isolation=bwrap)", "t.py::test_a[bwrap]"),
    ("t.py::test_a[x@y]", "t.py::test_a[x@y]"),  # xdist adds no group after a ']'
    ("t.py::test_a", "t.py::test_a"),
])
def test_the_group_xdist_appends_is_not_part_of_the_recorded_id(nodeid, plain):
    assert longest_first.plain_nodeid(nodeid) == plain


def test_the_recorded_durations_are_seconds_by_test_id():
    seconds = json.loads(longest_first.DURATIONS.read_text())
    assert seconds and all(isinstance(v, (int, float)) and v >= 0 for v in seconds.values())
    assert not [k for k in seconds if longest_first.plain_nodeid(k) != k], "ids recorded with their xdist group"
