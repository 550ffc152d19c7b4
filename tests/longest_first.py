"""The order in which xdist hands the suite's work to its workers: longest first.

A worker takes whole groups (``--dist loadgroup``: tests that share a module's server run on
one worker), and xdist hands groups out in collection order as workers come free
(``--no-loadscope-reorder``; its own reorder, by number of tests, put a single 100 s browser
test and the 80 s multi-host cluster after hundreds of one-second tests, so the run ended with
one worker busy and two idle). Ordering the groups by their measured seconds, longest first,
is the classic longest-processing-time rule: the run's tail is a short group, not a long one.

The seconds come from ``tests/durations.json``, which a run writes with
``--record-durations tests/durations.json`` (each test's setup, call and teardown). Stale
figures only make the order less good, never a test wrong; a test it does not know counts
as ``UNKNOWN_SECONDS``.
"""

from __future__ import annotations

import json
import pathlib

import pytest

DURATIONS = pathlib.Path(__file__).with_name("durations.json")
UNKNOWN_SECONDS = 0.5
#: Tests shorter than this are left out of the file (they count as UNKNOWN_SECONDS).
RECORDED_FROM_SECONDS = 0.5


def plain_nodeid(nodeid: str) -> str:
    """The test's id without the ``@group`` xdist appends (which it does only when no ``]``
    follows the ``@``)."""
    head, at, tail = nodeid.rpartition("@")
    return head if at and "]" not in tail else nodeid


def group_of(item: pytest.Item) -> str:
    """The work unit xdist's worker names for the item (xdist/remote.py): every
    ``xdist_group`` name it carries, sorted and joined by ``_``; a test of none is its own."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else item.nodeid


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """The items regrouped by their xdist group, groups ordered by total seconds (longest
    first); within a group, pytest's own order (which sets each fixture up once) is kept."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)

    def cost(members: list[pytest.Item]) -> float:
        return sum(seconds.get(plain_nodeid(item.nodeid), UNKNOWN_SECONDS) for item in members)

    ordered = sorted(groups.values(), key=cost, reverse=True)  # stable: ties keep collection order
    return [item for members in ordered for item in members]


def load(path: pathlib.Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


class LongestFirst:
    """Orders the collection longest group first on xdist's workers (where the order is what
    the controller hands out); a run in one process keeps pytest's order."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = longest_first(items, self.seconds)


class RecordDurations:
    """Sums each test's setup, call and teardown as the controller hears of them, and writes
    them (seconds, one decimal, longest first) when the run ends."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = plain_nodeid(report.nodeid)
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {k: round(v, 1) for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])
                if v >= RECORDED_FROM_SECONDS}
        self.path.write_text(json.dumps(kept, indent=0) + "\n")
