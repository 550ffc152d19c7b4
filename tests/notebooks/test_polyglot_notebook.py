"""The polyglot notebook (Python, Node.js with an npm package, C compiled with gcc) under
nbval, on the run's image with a root of its own (tests/own_root_image.py), its kernel
pointed at the session server and that image (SANDBOX_KERNEL_URL, _TOKEN, _IMAGE). Where
the image cannot be built (no root, no mmdebstrap) the fixture skips, saying why; a plain
`pytest --nbval notebooks/` skips the notebook itself, saying what it needs
(notebooks/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import support
from own_root_image import own_root_image  # noqa: F401 (the run's shared build)
from test_notebooks import NOTEBOOKS, REPO, SANITIZE, report

NOTEBOOK = NOTEBOOKS / "06-polyglot-analysis.ipynb"


@pytest.mark.slow
def test_the_polyglot_notebook_passes_nbval_on_its_own_root(sandbox_server, own_root_image, tmp_path):
    from kernel.install import install_kernelspec

    install_kernelspec(prefix=str(tmp_path))
    env = support.with_repo_on_path(dict(os.environ))
    env.pop("PYTEST_ADDOPTS", None)
    env.update({"JUPYTER_PATH": str(tmp_path / "share" / "jupyter"), "SANDBOX_KERNEL_URL": sandbox_server.url,
                "SANDBOX_KERNEL_TOKEN": sandbox_server.token, "SANDBOX_KERNEL_IMAGE": own_root_image["name"]})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--nbval", str(NOTEBOOK.relative_to(REPO)),
                           "--nbval-kernel-name", "sandbox", "--nbval-sanitize-with", str(SANITIZE.relative_to(REPO)),
                           "-p", "no:cacheprovider", "-o", "addopts="],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, report(proc)
    counts = support.summary_counts(proc.stdout)
    assert counts.get("passed") == support.code_cell_count(NOTEBOOK) and "skipped" not in counts, report(proc)
