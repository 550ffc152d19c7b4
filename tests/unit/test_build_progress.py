"""An image build's progress: in a pipe or a log the estimate, the named steps and the
result only (the kernel's status line shows the log's last line, so it is always a step);
on a terminal a tqdm bar counting the steps."""

from __future__ import annotations

import io

from sandbox.client.models import Execution
from sandbox.images.images import step_line
from sandbox.images.progress import BuildProgress

LINES = ["building image 'default' (7 packages: ...): about 1-2 min and 750 MiB of disk",
         step_line(1, "creating the Python environment"), step_line(2, "downloading and installing 7 packages"),
         "Collecting numpy", "Processing /opt/pypi/files/numpy-2.4.whl", "Successfully installed numpy-2.4",
         step_line(3, "compiling bytecode"), "warning: something to know", step_line(5, "packing the image"),
         "image 'default' built in 75.4 s (311 MiB)"]


def test_a_pipe_gets_the_estimate_the_steps_and_the_result():
    out = io.StringIO()
    with BuildProgress(out) as progress:
        for line in LINES:
            progress(line)
    assert out.getvalue().splitlines() == [LINES[0], LINES[1], LINES[2], LINES[6], LINES[7], LINES[8], LINES[9]]


def test_a_terminal_gets_a_bar_of_named_steps():
    out = io.StringIO()
    with BuildProgress(out, bar=True) as progress:
        for line in LINES[:4]:
            progress(line)
        assert progress.bar.n == 1 and progress.bar.total == 5
    text = out.getvalue()
    assert "downloading and installing 7 packages" in text and "steps" in text and "Collecting numpy" in text
    assert "5/5 steps" in text  # completed on a clean exit


def test_an_execution_prints_a_summary_not_its_outputs():
    run = Execution(status="ok", execution_count=3, stdout="x" * 500, results=[{"text/plain": "42"}],
                    display=[{"image/png": "iVBOR" * 10000, "text/plain": "<Figure>"}], duration=0.5)
    text = repr(run)
    assert len(text) < 300 and "iVBOR" not in text, text
    assert text.startswith("Execution(status='ok', execution_count=3, text='42', stdout='xxx")
    assert "(500 chars)" in text and "display=[image/png|text/plain]" in text and str(run) == text
