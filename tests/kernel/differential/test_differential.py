"""The sandbox kernel against ipykernel: the same request sequences to both in one run
(scenarios.py), and per request the same messages in the same order, the same reply
statuses, execution counts, MIME, transient and metadata keys, stream text and error names
(frontend.py), but for the rows of the table of intended differences (differences.py);
and each row really there, for its reason."""

from __future__ import annotations

import pprint

import pytest

from .differences import ANY, DIFFERENCES, allowed
from .scenarios import SCENARIOS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_frontend_sees_what_ipykernel_shows(runner, scenario):
    ipy, sbx = runner.run("ipykernel", scenario), runner.run("sandbox", scenario)
    assert list(ipy) == list(sbx)
    unexplained = []
    for label in ipy:
        if ipy[label].shape() != sbx[label].shape() and allowed(scenario, label, ipy[label], sbx[label]) is None:
            unexplained.append(f"{label!r}\n  ipykernel: {pprint.pformat(ipy[label].shape(), width=140)}"
                               f"\n  sandbox:   {pprint.pformat(sbx[label].shape(), width=140)}")
    assert not unexplained, "differences not in the table:\n" + "\n".join(unexplained)


@pytest.mark.parametrize("row", DIFFERENCES, ids=lambda row: row.name)
def test_each_intended_difference_is_real(runner, row):
    """The difference shows where the row says; under its control (the switch it comes
    from), the sandbox kernel does there what ipykernel does."""
    if row.scenario == ANY:
        # Only as slow as the host is: seen in this run's scenarios, or not at all.
        seen = [(runner.seen[("ipykernel", name, ())][label], observed)
                for (which, name, env), requests in list(runner.seen.items()) if which == "sandbox" and not env
                and ("ipykernel", name, ()) in runner.seen for label, observed in requests.items()
                if row.holds(runner.seen[("ipykernel", name, ())][label], observed)]
        if not seen:
            pytest.skip(f"{row.name}: no sandbox was slow to claim in this run, so nothing to compare")
        return
    ipy, sbx = runner.run("ipykernel", row.scenario)[row.request], runner.run("sandbox", row.scenario)[row.request]
    assert row.holds(ipy, sbx), (ipy.shape(), sbx.shape())
    if row.control is not None:
        controlled = runner.run("sandbox", row.scenario, **row.control)[row.request]
        assert controlled.shape() == ipy.shape(), (controlled.shape(), ipy.shape())
