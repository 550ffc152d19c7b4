"""The suite's xdist groups are groups to xdist itself.

Tests that share a module-scoped fixture (a suite's own servers, the multi-host cluster) are
marked with one ``xdist_group`` by tests/conftest.py so that one worker sets that fixture up
once. xdist reads the group from the test's id only under its own rule (the text after the
last ``@``, and only when no ``]`` follows it); a name it cannot read puts every test in a
work unit of its own, and each worker then builds the same cluster or server again. Checked
here with xdist's own scheduler code on the real suite's collection, and by a small run of
real workers: pytest 9.2 keeps a test's id where xdist 3.8 cannot add the group to it, which
put every test in a work unit of its own (pyproject pins pytest below 9.2 for that).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import subprocess
import sys

from xdist.scheduler.loadgroup import LoadGroupScheduling

REPO = pathlib.Path(__file__).resolve().parents[2]

PROBE = """
import json
def pytest_collection_finish(session):
    rows = [[item.nodeid, [m.args[0] for m in item.iter_markers("xdist_group")]] for item in session.items]
    print("GROUPS " + json.dumps(rows))
"""


def collected_groups(tmp_path: pathlib.Path, *paths: str) -> list[tuple[str, list[str]]]:
    (tmp_path / "groups_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "groups_probe", "-p", "no:cacheprovider", *paths],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("GROUPS ")), None)
    assert line is not None, done.stdout + done.stderr
    return [(nodeid, groups) for nodeid, groups in json.loads(line[len("GROUPS "):])]


def work_unit(nodeid: str, groups: list[str]) -> str:
    """The scope xdist's loadgroup scheduler gives the test (its worker adds ``@group``)."""
    marked = f"{nodeid}@{'_'.join(sorted(groups))}" if groups else nodeid
    return LoadGroupScheduling._split_scope(None, marked)  # type: ignore[arg-type]  # self is unused


def test_tests_sharing_a_module_fixture_are_one_work_unit_per_parameter(tmp_path):
    rows = collected_groups(tmp_path, "tests/multihost/test_gateway_cluster.py", "tests/security/test_redteam.py")
    units: dict[str, set[str]] = collections.defaultdict(set)
    for nodeid, groups in rows:
        if not groups:  # a test of no shared fixture (red team p21 starts servers of its own)
            assert "test_gateway_cluster" not in nodeid, f"{nodeid} uses the cluster but has no xdist group"
            continue
        tier = "gvisor" if "gvisor]" in nodeid else "bwrap" if "bwrap]" in nodeid else ""
        units[nodeid.split("::")[0] + tier].add(work_unit(nodeid, groups))
    cluster = units["tests/multihost/test_gateway_cluster.py"]
    assert len(cluster) == 1, f"the cluster's tests are {len(cluster)} work units: {sorted(cluster)[:3]}"
    assert len(units["tests/security/test_redteam.pybwrap"]) == 1, sorted(units["tests/security/test_redteam.pybwrap"])[:3]
    assert len(units["tests/security/test_redteam.pygvisor"]) == 1
    assert units["tests/security/test_redteam.pybwrap"] != units["tests/security/test_redteam.pygvisor"]


GROUPED = """
import os, pathlib, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    pathlib.Path(os.environ["GROUPED_OUT"], f"ran-{n}").write_text(os.environ.get("PYTEST_XDIST_WORKER", ""))
"""


def test_xdist_runs_one_group_on_one_worker(tmp_path):
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist", "-n", "3", "--dist", "loadgroup",
         "--rootdir", str(suite), str(suite)],
        # xdist alone: the suite's other plugins cost each worker seconds of imports here
        cwd=suite, env={**os.environ, "GROUPED_OUT": str(out), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = list(out.glob("ran-*"))
    assert len(ran) == 6, done.stdout
    workers = {path.read_text() for path in ran}
    assert len(workers) == 1, f"one xdist group ran on the workers {sorted(workers)}"
