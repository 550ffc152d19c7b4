"""The "Python (sandbox, gVisor)" kernelspec: the same kernel, configured by its argv to
create its sandbox with isolation gvisor on a server whose default is bwrap."""

from __future__ import annotations

import json
import pathlib

import support


def test_the_gvisor_kernelspec_runs_its_cells_in_a_gvisor_sandbox(sandbox_server, api, tmp_path, monkeypatch):

    from kernel.install import install_kernelspec

    spec_dir = pathlib.Path(install_kernelspec(prefix=str(tmp_path), isolation="gvisor"))
    assert spec_dir.name == "sandbox-gvisor"
    assert json.loads((spec_dir / "kernel.json").read_text())["display_name"] == "Python (sandbox, gVisor)"
    env = support.kernel_environ(sandbox_server, tmp_path / "share" / "jupyter")
    env.pop("SANDBOX_KERNEL_ISOLATION", None)  # only the kernelspec's argv may choose the tier
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])
    km, kc = support.start_kernel(spec_dir.name, env=env, cwd=str(tmp_path), startup_timeout=120)
    try:
        run = support.run_cell(kc, "x = 6 * 7; print(x)", timeout=180)
        assert run.status == "ok", run.errors
        assert run.stdout.strip() == "42"
        shown = support.run_cell(kc, "%sandbox", timeout=60)
        assert shown.status == "ok", shown.errors
        isolation_line = next(line for line in shown.stdout.splitlines() if line.startswith("isolation"))
        assert isolation_line.split()[1].rstrip(",") == "gvisor", shown.stdout
        mine = [s for s in api.get("/v1/sandboxes").json()["sandboxes"]
                if s["metadata"].get("kernel_pid") == km.provisioner.pid]
        assert [s["isolation"]["backend"] for s in mine] == ["gvisor"], mine
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
