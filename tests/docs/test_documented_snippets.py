"""Every code block of README.md and of the site's pages (docs/*.md) that is meant to run is
run here, as written, and what it prints is compared with the output the page shows under it.

A ```python or ```bash block runs unless the line just before its fence says why not:
``<!-- not run: REASON -->`` (a block that installs into your environment, starts a
long-lived server, needs root, a cluster or a model API, ...). Blocks of data (json, ini,
text, diagrams) are not code and are not run.

Python blocks run in a fresh interpreter against the session's test server, found as a
user's client finds it (``SANDBOX_KERNEL_STATE_DIR``: its socket); shell blocks run in
bash with the venv's bin first on PATH (as with an activated venv), the same state
directory, and ``ID`` set to a live sandbox, the variable the docs use for one. Both run in
a scratch directory holding a small ``data.csv``, the file the examples read.

A block whose page shows what it prints (an ``<!-- output -->`` block after it, see
tests/docblocks.py) must print that, doctest-style: ``...`` stands for any text (a duration,
an id), runs of whitespace count as one space. A ``print(...)`` line may not carry its output
in a comment, where nothing would check it.
"""

from __future__ import annotations

import doctest
import os
import pathlib
import re
import subprocess
import sys
import typing as t

import pytest
from docblocks import CODE, COMMAND_LINE, INCLUDED, SITE_PAGES, Block, blocks
from support import REPO, with_repo_on_path

RUN = [b for b in blocks() if b.lang in CODE and b.not_run is None]
OUTPUT_IN_A_COMMENT = re.compile(r"^[ \t]*print\(.*\)[ \t]+#", re.M)  # `print(x)   # 45`: unchecked


def output_matches(documented: str, printed: str) -> bool:
    """Doctest's comparison: ``...`` matches any text, whitespace runs are one space."""
    return doctest.OutputChecker().check_output(documented, printed, doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)


def run_block(block: Block, env: dict[str, str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", block.code] if block.lang == "python" else ["bash", "-e", "-o", "pipefail", "-c",
                                                                              block.code]
    return subprocess.run(argv, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=240)


def test_every_code_block_runs_or_says_why_not():
    code = [b for b in blocks() if b.lang in CODE]
    assert len(code) > 10 and RUN, "the block parser found no code"
    unexplained = [b.name for b in code if b.not_run is not None and len(b.not_run) < 10]
    assert not unexplained, f"'not run' needs a reason: {unexplained}"
    untyped = [b.name for b in blocks() if not b.lang and COMMAND_LINE.search(b.code)]
    assert not untyped, f"code without a language (so never run): {untyped}"
    cells = [b.name for b in blocks() if b.lang == "ipython" and b.path != REPO / "README.md"]
    assert not cells, f"notebook cells are run only for README's tour (tests/kernel/test_readme_tour.py): {cells}"


def test_every_page_of_the_site_is_read_for_blocks():
    """The snippets come from every page the site builds (docs/*.md), not a list that a new
    page could miss; and a page's documented outputs are attached to the block above them."""
    read = {b.path for b in blocks()}
    with_code = {p for p in [*SITE_PAGES, *INCLUDED] if "```" in p.read_text()}
    assert REPO / "bench" / "README.md" in INCLUDED, "the benchmarks page's include was not followed"
    assert with_code <= read and len(with_code) >= 10, sorted(p.name for p in with_code - read)
    assert sum(b.output is not None for b in RUN) >= 4, "the documented outputs were not found"


def test_no_printed_value_is_shown_only_in_a_comment():
    shown = [b.name for b in RUN if b.lang == "python" and OUTPUT_IN_A_COMMENT.search(b.code)]
    assert not shown, f"show what these print in an <!-- output --> block, where it is checked: {shown}"


@pytest.fixture
def scratch(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data.csv").write_text("week,impressions,clicks\n2026-05-04,1000,10\n2026-05-11,1200,13\n")
    return tmp_path


@pytest.fixture
def doc_env(sandbox_server, api) -> t.Iterator[dict[str, str]]:
    if sandbox_server.external:
        pytest.skip("the documented snippets find the server by its state directory, not on this host")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    env["SANDBOX_KERNEL_STATE_DIR"] = str(sandbox_server.state_dir)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    r = api.post("/v1/sandboxes", json={"ttl_seconds": 300})
    assert r.status_code == 201, r.text
    env["ID"] = r.json()["id"]
    yield with_repo_on_path(env)
    api.delete(f"/v1/sandboxes/{env['ID']}")


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_documented_block_runs_as_written(block: Block, doc_env, scratch):
    r = run_block(block, doc_env, scratch)
    assert r.returncode == 0, f"{block.name} failed ({r.returncode}):\n{block.code}\n--- stdout\n{r.stdout[-2000:]}" \
                              f"\n--- stderr\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if block.output is not None:
        assert output_matches(block.output, r.stdout), \
            f"{block.name} printed what its page does not show:\n--- shown\n{block.output}--- printed\n{r.stdout}"


def test_a_changed_printed_value_fails(doc_env, scratch):
    """The control: the client's first example, run for real, matches its documented output,
    and the same output with one value changed (45 for 46) does not."""
    block = next(b for b in RUN if b.output is not None and "45" in b.output)
    r = run_block(block, doc_env, scratch)
    assert output_matches(block.output, r.stdout), r.stdout
    assert not output_matches(block.output.replace("45", "46"), r.stdout)
