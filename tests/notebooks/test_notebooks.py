"""The example notebooks, validated by nbval through the sandbox kernel.

nbval re-runs every notebook in `notebooks/` through the `sandbox` kernel and compares each
cell's fresh output with the output stored in the notebook (after the masks in
notebooks/nbval_sanitize.cfg): the notebooks are documentation that cannot silently go
stale. It runs as a subprocess, as CI would run it by hand, so that this test run never
collects .ipynb files itself, and so that the kernels it starts point at the session's
server.

A validation that passes whatever the notebook prints would prove nothing: the second test
changes the answer of notebook 01 (its data, or its formula) and checks that nbval fails,
at the cell that computes the CTR.

To record outputs again after editing a notebook: tests/notebooks/record_outputs.py.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import typing as t

import httpx
import nbformat
import pytest

import support

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SANITIZE = NOTEBOOKS / "nbval_sanitize.cfg"
CTR_NOTEBOOK = "01-ctr-from-a-pushed-csv.ipynb"
CTR_CELL_CODE = "ctr = clicks / impressions * 100"
# Generous: five notebooks, two of which wait past a TTL and one runs a memory bomb.
NBVAL_TIMEOUT = 900


@pytest.fixture(scope="module")
def nbval_env(sandbox_server: support.Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the nbval subprocess (and so of its kernels): the session's
    server, and the kernelspec installed where jupyter_client looks."""
    from kernel.install import install_kernelspec

    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install_kernelspec(prefix=str(prefix))
    env = support.kernel_environ(sandbox_server, prefix / "share" / "jupyter")
    env.pop("PYTEST_ADDOPTS", None)  # the outer run's options are not nbval's
    return env


def run_nbval(target: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "pytest", "--nbval", str(target),
        "--nbval-kernel-name", "sandbox",
        "--nbval-sanitize-with", str(SANITIZE.relative_to(REPO)),
        "-p", "no:cacheprovider",
    ]
    return subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=NBVAL_TIMEOUT, stdin=subprocess.DEVNULL
    )


def report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"nbval exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-5000:]}"


def summary_counts(output: str) -> dict[str, int]:
    """pytest's last line, e.g. '3 failed, 14 passed in 20.1s' -> {'failed': 3, 'passed': 14}."""
    last = [line for line in output.splitlines() if line.strip()][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}


def failed_cells(output: str) -> set[int]:
    """The cells in pytest's FAILED summary lines (for a run over a single notebook: a
    notebook outside the rootdir gets an empty node path, '::Cell 3')."""
    return {int(n) for n in re.findall(r"^FAILED \S*::Cell (\d+)", output, flags=re.MULTILINE)}


def code_cell_index(path: pathlib.Path, needle: str) -> int:
    """nbval's number for the code cell containing `needle` (it counts code cells only)."""
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    (index,) = [i for i, c in enumerate(cells) if needle in c.source]
    return index


def code_cell_count(path: pathlib.Path) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


def live_sandboxes(server: support.Server) -> dict[str, dict[str, t.Any]]:
    r = httpx.get(f"{server.url}/v1/sandboxes", headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
    r.raise_for_status()
    return {s["id"]: s for s in r.json()["sandboxes"]}


def pid_alive(pid: t.Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def reap_killed_kernels_sandboxes(server: support.Server, before: set[str]) -> list[str]:
    """Delete the sandboxes of kernels nbval killed; returns whatever else was left.

    nbval stops each kernel with shutdown_kernel(now=True), a SIGKILL the kernel cannot
    answer, so its sandbox would live until its TTL: deleted here. Any other sandbox created
    during the run and still alive was leaked by a notebook.
    """
    others = []
    headers = {"Authorization": f"Bearer {server.token}"}
    for sid, sbx in live_sandboxes(server).items():
        if sid in before:
            continue
        meta = sbx.get("metadata") or {}
        if meta.get("client") == "sandbox-kernel" and not pid_alive(meta.get("kernel_pid")):
            httpx.delete(f"{server.url}/v1/sandboxes/{sid}", headers=headers, timeout=30)
        else:
            others.append(sid)
    return others


@pytest.mark.timeout(NBVAL_TIMEOUT + 60)
def test_notebooks_pass_nbval(sandbox_server: support.Server, nbval_env: dict[str, str]) -> None:
    """Every notebook re-runs through the sandbox kernel with the outputs it stores; no
    cell is skipped, and no notebook leaves a sandbox of its own running."""
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert [p.name for p in notebooks] == [
        "01-ctr-from-a-pushed-csv.ipynb",
        "02-what-the-sandbox-keeps-out.ipynb",
        "03-agent-tool-loop.ipynb",
        "04-lifecycle.ipynb",
        "05-adk-agent.ipynb",
    ]
    before = set(live_sandboxes(sandbox_server))
    began = time.monotonic()
    proc = run_nbval(NOTEBOOKS.relative_to(REPO), nbval_env)
    elapsed = time.monotonic() - began
    leftover = reap_killed_kernels_sandboxes(sandbox_server, before)
    assert proc.returncode == 0, report(proc)
    counts = summary_counts(proc.stdout)
    assert counts.get("passed") == sum(map(code_cell_count, notebooks)), report(proc)  # every cell ran
    assert not {"failed", "error", "errors", "skipped", "xfailed", "xpassed"} & set(counts), report(proc)
    assert leftover == [], f"sandboxes left running by the notebooks: {leftover}"
    print(f"nbval over {len(notebooks)} notebooks: {elapsed:.1f} s")
    # Nothing the notebooks pull is left next to them.
    assert not (NOTEBOOKS / "ctr_answer.json").exists()


def _change_data(workdir: pathlib.Path) -> str:
    """One week's clicks 67774 -> 76774: the CTR from the totals becomes 1.05 %."""
    csv_path = workdir / "data" / "campaign_weeks.csv"
    text = csv_path.read_text()
    assert text.count(",67774\n") == 1
    csv_path.write_text(text.replace(",67774\n", ",76774\n"))
    return "CTR 1.05 %"


def _change_formula(workdir: pathlib.Path) -> str:
    """The CTR cell multiplies by 1000 instead of 100: 10.13 %."""
    path = workdir / CTR_NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    (cell,) = [c for c in nb.cells if CTR_CELL_CODE in c.source]
    cell.source = cell.source.replace(CTR_CELL_CODE, "ctr = clicks / impressions * 1000")
    nbformat.write(nb, path)
    return "CTR 10.13 %"


@pytest.mark.timeout(NBVAL_TIMEOUT + 60)
@pytest.mark.parametrize("change", [_change_data, _change_formula], ids=["data", "formula"])
def test_changed_answer_fails_validation(
    sandbox_server: support.Server,
    nbval_env: dict[str, str],
    tmp_path: pathlib.Path,
    change: t.Callable[[pathlib.Path], str],
) -> None:
    """A copy of notebook 01 whose answer changed no longer validates, and the failure is
    at the CTR cell, showing the new figure; the cells before it still pass."""
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    shutil.copy(NOTEBOOKS / CTR_NOTEBOOK, workdir / CTR_NOTEBOOK)
    shutil.copytree(NOTEBOOKS / "data", workdir / "data")
    new_figure = change(workdir)

    before = set(live_sandboxes(sandbox_server))
    proc = run_nbval(workdir / CTR_NOTEBOOK, nbval_env)
    reap_killed_kernels_sandboxes(sandbox_server, before)

    assert proc.returncode == 1, report(proc)  # 1: tests failed (not a usage or internal error)
    failed = failed_cells(proc.stdout)
    ctr_cell = code_cell_index(workdir / CTR_NOTEBOOK, "ctr = clicks / impressions")
    push_cell = code_cell_index(workdir / CTR_NOTEBOOK, "%push")
    assert ctr_cell in failed, report(proc)
    assert push_cell not in failed and min(failed) >= push_cell + 1, report(proc)
    assert "Cell outputs differ" in proc.stdout, report(proc)
    assert new_figure in proc.stdout, report(proc)
    assert summary_counts(proc.stdout)["passed"] >= push_cell + 1, report(proc)
    if change is _change_formula:
        # The host's own recomputation rejects the sandbox's answer as well.
        host_cell = code_cell_index(workdir / CTR_NOTEBOOK, "%%host\nimport csv")
        assert host_cell in failed, report(proc)
        assert "AssertionError: the sandbox said 10.13, the host 1.01" in proc.stdout, report(proc)
    assert not (workdir / "ctr_answer.json").exists()
