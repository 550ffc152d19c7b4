"""What a notebook shows of a cell beyond its plain output, as ipykernel users expect it:
big prints cut in the sandbox with a note (so the Jupyter server's IOPub rate limit never
drops output silently), a time limit that names its setting, math that exports, kernel
notes that are notes and not errors. Through jupyter_client, against the real kernel and
server."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from tests.support import run_cell

# Each starts a kernel of its own (the settings differ) and runs seconds of cells.
pytestmark = pytest.mark.slow

MiB = 1024 * 1024


def stream_bytes(run) -> int:
    return sum(len(m["content"]["text"].encode()) for m in run.of_type("stream"))


def test_a_30_mb_print_is_cut_in_the_sandbox_with_a_note(start_kernel):
    km, kc = start_kernel()
    run = run_cell(kc, "print('x' * 30_000_000)", timeout=120)
    assert run.status == "ok", run.errors
    received = stream_bytes(run)
    # What reaches the frontend is bounded by the kernel's stream limit (1 MiB by default):
    # well under the Jupyter server's IOPub rate limit (1 MB/s over 3 s), so the server
    # never answers "IOPub data rate exceeded" and drops the rest, note included.
    assert MiB - 64 <= received <= MiB, received
    assert run.stderr == "", "the note is not on stderr"
    note = run.notes
    assert "output truncated" in note and "27.6 MiB of text past the first 1.0 MiB were dropped" in note, note
    assert "%pull out.txt" in note and "/workspace" in note, note
    # The sandbox is fine and the next cell's output is whole.
    nxt = run_cell(kc, "print('y' * 1000)")
    assert nxt.stdout == "y" * 1000 + "\n" and nxt.notes == ""


def test_the_stream_limit_is_the_kernels_setting_and_zero_lifts_it(start_kernel):
    """The control of the test above: with the kernel's limit lifted, the same kind of print
    sends everything (up to the server's output cap), so the bound above is the limit's doing."""
    cell = "print('x' * 3_000_000)"
    km, kc = start_kernel(SANDBOX_KERNEL_STREAM_LIMIT="0")
    unlimited = run_cell(kc, cell, timeout=120)
    assert unlimited.status == "ok" and stream_bytes(unlimited) == 3_000_001 and unlimited.notes == ""
    km, kc = start_kernel(SANDBOX_KERNEL_STREAM_LIMIT="100000")
    limited = run_cell(kc, cell, timeout=120)
    assert stream_bytes(limited) == 100_000 and "past the first 100000 bytes were dropped" in limited.notes


def test_a_timeout_names_the_setting_that_raises_it_and_the_magic_raises_it(start_kernel):
    km, kc = start_kernel(SANDBOX_KERNEL_TIMEOUT="1")
    run = run_cell(kc, "import time\nkept = 5\ntime.sleep(30)", timeout=60, stop_on_error=False)
    assert run.status == "error" and run.errors[0]["ename"] == "TimeoutError", run.errors
    note = run.notes
    assert "SANDBOX_KERNEL_TIMEOUT" in note and "%sandbox timeout SECONDS" in note and "execute_timeout" in note, note
    assert run_cell(kc, "%sandbox timeout").stdout == "cell timeout: 1 s\n"
    assert run_cell(kc, "%sandbox timeout 20").stdout == "cell timeout: 20 s from the next cell on\n"
    slower = run_cell(kc, "time.sleep(2)\nkept", timeout=60)
    assert slower.status == "ok" and slower.result_text() == "5", "raised without a new kernel: variables kept"
    bad = run_cell(kc, "%sandbox timeout soon", stop_on_error=False)
    assert bad.status == "error" and "'soon' is not a number of seconds" in bad.errors[0]["evalue"]


def test_math_keeps_its_latex_beside_the_frame_and_nbconvert_exports_it(start_kernel, tmp_path):
    km, kc = start_kernel()
    code = "from IPython.display import Math, display\ndisplay(Math(r'\\frac{a}{b} = \\sqrt{x}'))"
    run = run_cell(kc, code)
    (shown,) = run.of_type("display_data")
    data = shown["content"]["data"]
    assert data["text/latex"] == "$\\displaystyle \\frac{a}{b} = \\sqrt{x}$", data.keys()
    assert "&lt;math" in data["text/html"] and data["text/html"].startswith("<iframe"), "the page gets the frame"
    # The notebook as a frontend saves it, exported to LaTeX by nbconvert.
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code, execution_count=1, outputs=[
        nbformat.v4.new_output("display_data", data=data, metadata=shown["content"]["metadata"])])])
    nb.metadata["kernelspec"] = {"name": "sandbox", "display_name": "Python (sandbox)", "language": "python"}
    path = tmp_path / "math.ipynb"
    nbformat.write(nb, path)
    done = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "latex", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    tex = (tmp_path / "math.tex").read_text()
    assert "\\frac{a}{b} = \\sqrt{x}" in tex, tex[-2000:]
    assert "iframe" not in tex

