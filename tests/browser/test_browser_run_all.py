"""Run All in JupyterLab stops at the first failing cell, as it does on ipykernel: the
cells after it are not run, neither in the sandbox nor on the host.

The probe is at the effect: the third cell is a ``%%host`` cell that writes a file next to
the notebook, and the fourth a sandbox cell that pushes nothing but would print. The
control is the same notebook without the error: the file appears and every cell runs.
"""

from __future__ import annotations

import json
import typing as t

import support
from test_browser_jupyterlab import CELL_MS, Notebook, lab_page
from test_browser_jupyterlab import pytestmark  # noqa: F401  (slow, timeout, skip without a browser)
from test_browser_output_isolation import open_in_lab

MARKER = "cell-3-ran"


def notebook(failing: bool) -> dict[str, t.Any]:
    sources = [
        "total = 10",
        "share = total / 0" if failing else "share = total / 2",
        f"%%host\nopen({MARKER!r}, 'w').close()",
        "print('cell 4 ran')",
    ]
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": source} for i, source in enumerate(sources)]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "sandbox", "display_name": "Python (sandbox)",
                                                        "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def run_all(page: t.Any, lab: t.Any, name: str) -> Notebook:
    nb = open_in_lab(page, lab, name)
    nb.click_run_all()
    nb.wait_done(1, CELL_MS)  # the second cell, failing or not, ends with its count
    nb.wait_status("idle", CELL_MS)
    page.wait_for_timeout(2_000)  # what the kernel would still run comes now, if anything
    nb.wait_status("idle", CELL_MS)
    return nb


def test_run_all_stops_at_the_failing_cell(sandbox_server: support.Server) -> None:
    with lab_page(sandbox_server, "run-all") as (page, lab):
        (lab.root / "stops.ipynb").write_text(json.dumps(notebook(failing=True)))
        (lab.root / "control.ipynb").write_text(json.dumps(notebook(failing=False)))

        nb = run_all(page, lab, "stops.ipynb")
        prompts = [nb.prompt(i) for i in range(4)]
        nb.shot("run-all-stops.png")
        assert "ZeroDivisionError" in nb.output_text(1), nb.output_text(1)
        assert prompts[:2] == ["[1]:", "[2]:"], prompts
        assert prompts[2:] == ["[ ]:", "[ ]:"], f"cells after the error ran: {prompts}"
        assert not (lab.root / MARKER).exists(), "the %%host cell after the error ran"
        assert "cell 4 ran" not in nb.output_text(3)

        # The control: without the error, Run All reaches the probes (another tab, its own kernel).
        nb = run_all(page, lab, "control.ipynb")
        nb.wait_done(3, CELL_MS)
        assert [nb.prompt(i) for i in range(4)] == ["[1]:", "[2]:", "[3]:", "[4]:"]
        assert (lab.root / MARKER).exists(), "the control's %%host cell did not run"
        assert "cell 4 ran" in nb.output_text(3)
