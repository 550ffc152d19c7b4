"""What the notebook is told of its sandbox's resources: the memory note after a cell past
80 % of memory_mb (and none below), the peak an out-of-memory end reached, the usage lines
of %sandbox, and %sandbox packages against pip list in a cell."""

from __future__ import annotations

import json

import pytest
from support import run_cell

from sandbox.images.images import DEFAULT_PRELOAD

MiB = 1024 * 1024


def hold(mb: int) -> str:
    return f"held_{mb} = bytearray({mb} * 1024 * 1024)\nfor i in range(0, len(held_{mb}), 4096): held_{mb}[i] = 1"


@pytest.mark.slow
def test_memory_note_past_80_percent_and_the_peak_of_an_oom(start_kernel):
    km, kc = start_kernel(SANDBOX_KERNEL_MEMORY_MB="512")
    # The libraries a warm sandbox preloads, imported in any case: the same footing whether
    # the kernel got a warm sandbox or a cold one (which imports them on first use).
    below = run_cell(kc, f"import {', '.join(DEFAULT_PRELOAD)}\n" + hold(40))
    assert below.status == "ok" and "[sandbox: memory" not in below.notes, below.notes
    above = run_cell(kc, hold(330))
    assert above.status == "ok", above.errors
    note = above.notes
    assert "[sandbox: memory at " in note and "of 512.0 MiB" in note and "memory limit" in note, note
    share = int(note.split("(")[1].split(" %")[0])
    assert 80 < share <= 100, note
    report = run_cell(kc, "%sandbox").stdout
    assert "usage" in report and "at most, of 512.0 MiB" in report and "CPU " in report, report
    oom = run_cell(kc, hold(200), stop_on_error=False)
    assert oom.status == "error" and oom.errors[0]["ename"] == "SandboxDied", oom.outputs
    assert "[sandbox: out of memory: the sandbox reached " in oom.notes and "512.0 MiB limit" in oom.notes, \
        oom.notes


def test_sandbox_packages_match_pip_list_in_a_cell(kc):
    shown = run_cell(kc, "%sandbox packages")
    assert shown.status == "ok", shown.outputs
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("image default: ") and lines[1].split() == ["NAME", "VERSION", "LAYER"]
    listed = {line.split()[0].lower().replace("_", "-"): line.split()[1] for line in lines[2:]}
    cell = run_cell(kc, "import subprocess, sys\nprint(subprocess.run([sys.executable, '-m', 'pip', 'list', "
                        "'--format=json', '--disable-pip-version-check'], capture_output=True, text=True).stdout)")
    assert cell.status == "ok", cell.outputs
    pip = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(cell.stdout)}
    assert listed == pip
    bad = run_cell(kc, "%sandbox pakages", stop_on_error=False)
    assert bad.status == "error" and "%sandbox packages" in bad.errors[0]["evalue"]
