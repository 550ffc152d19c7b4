"""README's tour, cell by cell as written (its ```ipython blocks), in a real "Python (sandbox)"
kernel started in a folder holding the tour's data.csv, as a notebook there would be.

Where the bytes land: `%pull ctr.csv` writes the sandbox's file into the kernel's folder (the
notebook's), with the CTR the sandbox computed; the chart comes back as a PNG; `%sandbox`
names the sandbox. The control: the same cells without the `%pull` line leave no ctr.csv in
the folder, so the file found there is the pull's doing."""

from __future__ import annotations

import base64
import pathlib

import pytest
from docblocks import blocks

import support
from support import REPO

pytestmark = pytest.mark.slow  # a kernel and its sandbox, twice

DATA = "week,impressions,clicks\n2026-05-04,1000,10\n2026-05-11,1200,13\n"


def tour_cells() -> list[str]:
    cells = [b.code for b in blocks([REPO / "README.md"]) if b.lang == "ipython"]
    assert len(cells) >= 3 and any("%push" in c for c in cells) and any("%pull" in c for c in cells), cells
    return cells


def run_tour(start_kernel, folder: pathlib.Path, cells: list[str]) -> list[support.CellRun]:
    folder.mkdir()
    (folder / "data.csv").write_text(DATA)
    _, kc = start_kernel(cwd=folder)
    runs = [support.run_cell(kc, cell, timeout=180) for cell in cells]
    for cell, run in zip(cells, runs):
        assert run.status == "ok" and not run.errors, (cell, run.reply["content"], run.errors)
    return runs


def test_the_tour_runs_as_written(start_kernel, tmp_path):
    runs = run_tour(start_kernel, tmp_path / "notebook", tour_cells())
    pulled = tmp_path / "notebook" / "ctr.csv"
    assert pulled.read_text().splitlines()[1:] == ["2026-05-04,1000,10,0.01", "2026-05-11,1200,13,0.010833333333333334"]
    pngs = [m["content"]["data"]["image/png"] for run in runs for m in run.visible()
            if "image/png" in m["content"].get("data", {})]
    assert pngs and base64.b64decode(pngs[0]).startswith(b"\x89PNG"), "the chart did not come back"
    report = " ".join(m["content"].get("text") or str(m["content"].get("data", {}).get("text/plain", ""))
                      for m in runs[-1].visible())
    assert "sbx-" in report, report


def test_control_without_the_pull_nothing_lands(start_kernel, tmp_path):
    cells = [c.replace("%pull ctr.csv\n", "") for c in tour_cells()]
    run_tour(start_kernel, tmp_path / "notebook", cells)
    assert not (tmp_path / "notebook" / "ctr.csv").exists()
