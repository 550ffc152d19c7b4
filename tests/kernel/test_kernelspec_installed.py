"""`pip install` alone makes the kernel selectable: the kernelspec ships as data files."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys


def test_pip_installed_the_kernelspec_where_jupyter_finds_it():
    shipped = [f for f in importlib.metadata.files("sandbox-kernel") or []
               if str(f).replace("\\", "/").endswith("share/jupyter/kernels/sandbox/kernel.json")]
    assert shipped, "the distribution's RECORD has no share/jupyter/kernels/sandbox/kernel.json"
    spec = json.loads(shipped[0].locate().read_text())
    assert spec["display_name"] == "Python (sandbox)"
    assert spec["interrupt_mode"] == "message"
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "sandbox" in json.loads(out.stdout)["kernelspecs"]
