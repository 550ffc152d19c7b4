"""The mutation check's list still fits the code (scripts/mutation_check.py).

The check itself takes minutes and runs before a release; this runs on every test run so
that a refactor that moves a protection's text breaks loudly here ("mutation no longer
applies") instead of leaving a mutation that cannot be applied any more.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "mutation_check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("mutation_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = load_check()


@pytest.mark.parametrize("mutation", check.MUTATIONS, ids=lambda m: m.name)
def test_every_mutation_still_applies_and_names_existing_tests(mutation):
    assert check.problems(mutation) == []


def test_the_check_reports_a_moved_protection(tmp_path):
    """Control: text that is gone, or there twice, or a test that is gone is a problem."""
    (tmp_path / "code.py").write_text("guard()\nguard()\n")
    (tmp_path / "test_it.py").write_text("def test_guard():\n    pass\n")
    twice = check.mutation("m", "a guard", "code.py", "guard()", "pass", "test_it.py::test_guard")
    gone = check.mutation("m", "a guard", "code.py", "shield()", "pass", "test_it.py::test_gone")
    assert "2 times" in " ".join(check.problems(twice, tmp_path))
    found = check.problems(gone, tmp_path)
    assert "0 times" in found[0] and "no test test_gone" in found[1], found
    once = check.mutation("m", "a guard", "code.py", "guard()\nguard()", "pass", "test_it.py::test_guard")
    assert check.problems(once, tmp_path) == []


def test_names_are_unique():
    names = [m.name for m in check.MUTATIONS]
    assert len(names) == len(set(names))
