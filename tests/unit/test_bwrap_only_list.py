"""docs/security.md's list of the tests that do not apply to the gvisor tier is the markers' own
(scripts/bwrap_only.py): a test newly marked, unmarked or given another reason without
`scripts/bwrap_only.py --write` fails here."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bwrap_only.py"


def load():
    spec = importlib.util.spec_from_file_location("bwrap_only", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


lister = load()


def test_the_security_page_lists_exactly_the_marked_tests():
    page = (lister.REPO / "docs" / "security.md").read_text()
    assert lister.page_block(page) == lister.markdown(), "run: python3 scripts/bwrap_only.py --write"
    assert lister.bwrap_only(), "control: the tiered suites mark some tests bwrap only"


def test_the_lister_finds_marked_tests_and_modules(tmp_path):
    """Control: a decorated test and a marked module are found, with their reasons, and an
    unmarked test is not."""
    for suite in lister.SUITES:
        (tmp_path / suite).mkdir(parents=True)
    (tmp_path / "tests/security/test_a.py").write_text(
        "import pytest\n\n@pytest.mark.bwrap_only(reason='why ' 'not')\ndef test_one():\n    pass\n\n"
        "def test_two():\n    pass\n")
    (tmp_path / "tests/reliability/test_b.py").write_text(
        "import pytest\npytestmark = pytest.mark.bwrap_only(reason='all of it')\n")
    assert lister.bwrap_only(tmp_path) == [("tests/security/test_a.py::test_one", "why not"),
                                           ("tests/reliability/test_b.py (every test)", "all of it")]
