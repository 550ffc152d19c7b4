"""Every code block of README.md and docs/*.md that is meant to run is run here, as written.

A ```python or ```bash block runs unless the line just before its fence says why not:
``<!-- not run: REASON -->`` (a block that installs into your environment, starts a
long-lived server, needs root, a cluster or a model API, ...). Blocks of data (json, ini,
text, diagrams) are not code and are not run.

Python blocks run in a fresh interpreter against the session's test server, found as a
user's client finds it (``SANDBOX_KERNEL_STATE_DIR``: its socket); shell blocks run in
bash with the venv's bin first on PATH (as with an activated venv), the same state
directory, and ``ID`` set to a live sandbox, the variable the docs use for one. Both run in
a scratch directory holding a small ``data.csv``, the file the examples read.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import typing as t

import pytest
from docblocks import CODE, COMMAND_LINE, Block, blocks
from support import with_repo_on_path

RUN = [b for b in blocks() if b.lang in CODE and b.not_run is None]


def test_every_code_block_runs_or_says_why_not():
    code = [b for b in blocks() if b.lang in CODE]
    assert len(code) > 10 and RUN, "the block parser found no code"
    unexplained = [b.name for b in code if b.not_run is not None and len(b.not_run) < 10]
    assert not unexplained, f"'not run' needs a reason: {unexplained}"
    untyped = [b.name for b in blocks() if not b.lang and COMMAND_LINE.search(b.code)]
    assert not untyped, f"code without a language (so never run): {untyped}"


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
    argv = [sys.executable, "-c", block.code] if block.lang == "python" else ["bash", "-e", "-o", "pipefail", "-c",
                                                                              block.code]
    r = subprocess.run(argv, cwd=str(scratch), env=doc_env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{block.name} failed ({r.returncode}):\n{block.code}\n--- stdout\n{r.stdout[-2000:]}" \
                              f"\n--- stderr\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
