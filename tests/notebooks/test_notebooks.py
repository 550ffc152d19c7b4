"""The example notebooks, validated by nbval through the sandbox kernel.

nbval re-runs notebooks through the `sandbox` kernel and compares each cell's fresh output
with the output stored in the notebook (after the masks in notebooks/nbval_sanitize.cfg): the
notebooks are documentation that cannot silently go stale. Every notebook runs under nbval as
an ordinary user in tests/docs/test_fresh_clone.py (README's first day); here, as root, run
the two whose stored facts come from what differs between the modes: 01 (the airlock's
`%push`, a `%%host` cell beside the sandbox) and 02 (what the isolation keeps out, a memory
bomb stopped at its limit). 03-05 (an agent loop, the TTL, ADK) run the same server code in
either mode. It runs as a subprocess, as a user runs it by hand (`pytest --nbval notebooks/
--nbval-kernel-name sandbox`), so that this test run never collects .ipynb files itself.

As a user runs it means the embedded default: no SANDBOX_KERNEL_* variable reaches nbval
or its kernels, so the first kernel starts the server of the default state directory and
every `%%host` cell finds it the way the kernel does. The default state directory of root
is /var/lib/sandbox-kernel, shared by everything on the host; nbval therefore runs in a
private mount namespace (`unshare --mount`) where a fresh state directory of this module
is bind-mounted at that path: the default is exercised as is, and nothing outside the
namespace is touched. nbval kills its kernels (SIGKILL, no shutdown request); the server
must end each killed kernel's sandbox by itself, so after a run no sandbox may be left.

A validation that passes whatever the notebook prints would prove nothing: the second test
changes the answer of notebook 01 (its data, or its formula) and checks that nbval fails,
at the cell that computes the CTR.

To record outputs again after editing a notebook: tests/notebooks/record_outputs.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import typing as t
from dataclasses import dataclass

import httpx
import nbformat
import pytest

import support

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SANITIZE = NOTEBOOKS / "nbval_sanitize.cfg"
CTR_NOTEBOOK = "01-ctr-from-a-pushed-csv.ipynb"
CTR_CELL_CODE = "ctr = clicks / impressions * 100"
# Generous: one of the notebooks runs a memory bomb.
NBVAL_TIMEOUT = 900
# Run as root here (the module docstring says why these); every notebook runs as a user in
# tests/docs/test_fresh_clone.py.
AS_ROOT = ["01-ctr-from-a-pushed-csv.ipynb", "02-what-the-sandbox-keeps-out.ipynb"]


# Where the embedded default looks when nothing says otherwise (sandbox/common/paths.py).
DEFAULT_STATE_DIR = pathlib.Path("/var/lib/sandbox-kernel")


@dataclass
class EmbeddedDefault:
    """A user's setup: the kernelspec installed, no SANDBOX_KERNEL_* variable, and the
    state directory (seen at the default path inside nbval's mount namespace)."""

    env: dict[str, str]
    state_dir: pathlib.Path

    def client(self) -> httpx.Client:
        """The embedded server, reached from outside the namespace by its socket's real path."""
        transport = httpx.HTTPTransport(uds=str(self.state_dir / "server.sock"))
        return httpx.Client(base_url="http://sandbox-kernel", transport=transport, timeout=30)


@pytest.fixture(scope="module")
def embedded(sandbox_server: support.Server, tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[EmbeddedDefault]:
    if os.geteuid() != 0:
        pytest.skip("binding a state directory at the default path needs root (unshare --mount)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    from kernel.install import install_kernelspec

    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    install_kernelspec(prefix=str(prefix))
    env = support.with_repo_on_path(dict(os.environ))
    for key in [k for k in env if k.startswith("SANDBOX_KERNEL_")]:
        del env[key]
    env.pop("PYTEST_ADDOPTS", None)  # the outer run's options are not nbval's
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")  # where `sandbox-kernel install --user` puts it
    state = support.make_state_dir("sbk-nbval-", images_from=sandbox_server.state_dir)
    try:
        yield EmbeddedDefault(env, state)
    finally:
        stop_embedded_server(state)
        support.sweep(state)
        shutil.rmtree(state, ignore_errors=True)


def stop_embedded_server(state: pathlib.Path) -> None:
    """The server the first kernel started outlives nbval (as it outlives a user's kernels)."""
    try:
        pid = int(json.loads((state / "server.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return
    if support.pid_alive(pid):
        support.signal_server(pid, signal.SIGTERM)
        support.wait_for(lambda: not support.pid_alive(pid), 30)


def run_nbval(targets: list[pathlib.Path], embedded: EmbeddedDefault) -> subprocess.CompletedProcess[str]:
    nbval = [
        sys.executable, "-m", "pytest", "--nbval", *map(str, targets),
        "--nbval-kernel-name", "sandbox",
        "--nbval-sanitize-with", str(SANITIZE.relative_to(REPO)),
        "-p", "no:cacheprovider", "-o", "addopts=",  # one process: not the suite's xdist workers
    ]
    # In its own mount namespace, the module's state directory stands at the default path.
    # The namespace starts with a copy of every mount of the host, whose mounts are private
    # here: the copies of other tests' sandbox workspaces are let go of first, or they would
    # hold those images while nbval runs, and a paused gVisor sandbox could not be restored
    # (sandbox/isolation/disk.py, pinning_namespaces).
    in_namespace = (
        "findmnt -rn -o TARGET | grep '/sandboxes/sbx-[^/]*/workspace$' | sort -r | xargs -r umount -l; "
        f"mkdir -p {DEFAULT_STATE_DIR} && mount --bind {embedded.state_dir} {DEFAULT_STATE_DIR} && exec \"$@\""
    )
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", in_namespace, "sh", *nbval]
    return subprocess.run(
        cmd, cwd=REPO, env=embedded.env, capture_output=True, text=True, timeout=NBVAL_TIMEOUT, stdin=subprocess.DEVNULL
    )


def report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"nbval exited with {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-5000:]}"


def failed_cells(output: str) -> set[int]:
    """The cells in pytest's FAILED summary lines (for a run over a single notebook: a
    notebook outside the rootdir gets an empty node path, '::Cell 3')."""
    return {int(n) for n in re.findall(r"^FAILED \S*::Cell (\d+)", output, flags=re.MULTILINE)}


def code_cell_index(path: pathlib.Path, needle: str) -> int:
    """nbval's number for the code cell containing `needle` (it counts code cells only)."""
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    (index,) = [i for i, c in enumerate(cells) if needle in c.source]
    return index


def running_sandboxes(embedded: EmbeddedDefault) -> list[str]:
    with embedded.client() as client:
        r = client.get("/v1/sandboxes")
        r.raise_for_status()
        return [s["id"] for s in r.json()["sandboxes"] if s["state"] == "running"]


def left_running(embedded: EmbeddedDefault) -> list[str]:
    """Sandboxes still running once nbval is done (warm-pool sandboxes are never listed).
    nbval SIGKILLs its kernels; the server notices each death (a pidfd per kernel) and ends
    that kernel's sandbox by itself, asynchronously: waited for, a bounded time."""
    support.wait_for(lambda: not running_sandboxes(embedded), 60, interval=0.5)
    return running_sandboxes(embedded)


@pytest.mark.slow  # about 11 s alone; the quick tier keeps the two runs of notebook 01 below
@pytest.mark.timeout(NBVAL_TIMEOUT + 60)
def test_notebooks_pass_nbval(embedded: EmbeddedDefault) -> None:
    """Notebooks 01 and 02 re-run through the sandbox kernel as root, on the embedded default,
    with the outputs they store; no cell is skipped, and no sandbox is left running afterwards."""
    targets = [NOTEBOOKS / name for name in AS_ROOT]
    assert all(p.is_file() for p in targets), targets
    began = time.monotonic()
    proc = run_nbval([p.relative_to(REPO) for p in targets], embedded)
    elapsed = time.monotonic() - began
    assert proc.returncode == 0, report(proc)
    # the kernels found the default state directory's server: the one the first kernel started
    log = (embedded.state_dir / "server.log").read_text(errors="replace")
    assert log.count("--- started by kernel pid") == 1, log[-3000:]
    leftover = left_running(embedded)
    counts = support.summary_counts(proc.stdout)
    assert counts.get("passed") == sum(map(support.code_cell_count, targets)), report(proc)  # every cell ran
    assert not {"failed", "error", "errors", "skipped", "xfailed", "xpassed"} & set(counts), report(proc)
    assert leftover == [], f"sandboxes left running by the notebooks: {leftover}"
    print(f"nbval over {len(targets)} notebooks: {elapsed:.1f} s")
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
    embedded: EmbeddedDefault,
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

    proc = run_nbval([workdir / CTR_NOTEBOOK], embedded)
    assert left_running(embedded) == []

    assert proc.returncode == 1, report(proc)  # 1: tests failed (not a usage or internal error)
    failed = failed_cells(proc.stdout)
    ctr_cell = code_cell_index(workdir / CTR_NOTEBOOK, "ctr = clicks / impressions")
    push_cell = code_cell_index(workdir / CTR_NOTEBOOK, "%push")
    assert ctr_cell in failed, report(proc)
    assert push_cell not in failed and min(failed) >= push_cell + 1, report(proc)
    assert "Cell outputs differ" in proc.stdout, report(proc)
    assert new_figure in proc.stdout, report(proc)
    assert support.summary_counts(proc.stdout)["passed"] >= push_cell + 1, report(proc)
    if change is _change_formula:
        # The host's own recomputation rejects the sandbox's answer as well.
        host_cell = code_cell_index(workdir / CTR_NOTEBOOK, "%%host\nimport csv")
        assert host_cell in failed, report(proc)
        assert "AssertionError: the sandbox said 10.13, the host 1.01" in proc.stdout, report(proc)
    assert not (workdir / "ctr_answer.json").exists()
