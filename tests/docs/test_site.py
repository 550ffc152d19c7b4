"""The documentation site builds from docs/ with Sphinx, warnings as errors (a broken link
between pages, a heading an anchor no longer names, a page left out of the table of contents,
a docstring autodoc cannot read): what CI would otherwise publish broken."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from support import REPO

DOCS = REPO / "docs"


def sphinx_build(source: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess:
    pytest.importorskip("myst_parser", reason="the docs extra is not installed: pip install -e '.[docs]'")
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d",
                           str(out / "doctrees"), str(source), str(out / "html")],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO))


@pytest.mark.slow  # the whole site, autodoc included: 8 CPU-seconds
def test_the_site_builds_without_a_warning(tmp_path):
    r = sphinx_build(DOCS, tmp_path)
    assert r.returncode == 0, f"sphinx-build -W failed:\n{r.stderr[-6000:]}"
    html = tmp_path / "html"
    pages = {p.stem for p in DOCS.glob("*.md")}
    assert pages <= {p.stem for p in html.glob("*.html")}, "a page of docs/ was not built"
    reference = (html / "client-reference.html").read_text()
    assert "run_code" in reference and "SandboxGone" in reference, "autodoc read no docstring"


@pytest.mark.parametrize("broken", [False, True], ids=["control", "broken-link"])
def test_a_broken_link_fails_the_build(tmp_path, broken):
    """With the site's own configuration, a two-page site builds, and the same site with one
    link to a heading that does not exist fails: a passing build means the links hold."""
    source = tmp_path / "docs"
    source.mkdir()
    (source / "conf.py").write_text((DOCS / "conf.py").read_text())
    (source / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n\n## A heading\n")
    target = "no-such-heading" if broken else "a-heading"
    (source / "page.md").write_text(f"# Page\n\nSee [there](index.md#{target}).\n")
    r = sphinx_build(source, tmp_path / "out")
    if broken:
        assert r.returncode != 0 and "no-such-heading" in r.stderr, r.stderr[-3000:]
    else:
        assert r.returncode == 0, r.stderr[-3000:]
