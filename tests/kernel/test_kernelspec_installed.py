"""`pip install` alone makes the kernels selectable: the kernelspecs (one per isolation tier)
ship as data files."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys


def test_pip_installed_the_kernelspec_where_jupyter_finds_it(tmp_path):
    installed = pathlib.Path(sys.prefix, "share", "jupyter", "kernels", "sandbox", "kernel.json")
    assert installed.is_file(), f"pip install did not put the kernelspec at {installed}"
    spec = json.loads(installed.read_text())
    assert spec["display_name"] == "Python (sandbox)"
    assert spec["interrupt_mode"] == "message"
    # As a fresh shell sees it: no test prefix on JUPYTER_PATH, an empty per-user data dir.
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_DATA_DIR")}
    env["JUPYTER_DATA_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    specs = json.loads(out.stdout)["kernelspecs"]
    assert "sandbox" in specs
    assert pathlib.Path(specs["sandbox"]["resource_dir"]).resolve() == installed.parent.resolve()
    gvisor = json.loads((installed.parent.parent / "sandbox-gvisor" / "kernel.json").read_text())
    assert gvisor["display_name"] == "Python (sandbox, gVisor)"
    assert gvisor["argv"][-1] == "--SandboxKernel.isolation=gvisor"
    assert "sandbox-gvisor" in specs
