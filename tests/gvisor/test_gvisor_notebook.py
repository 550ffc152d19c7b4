"""A notebook's sandbox on the gVisor tier: shutting the kernel down pauses it (its memory to
disk), the server may restart meanwhile, and the notebook's next kernel resumes it with the
state it had (kernel/keeping.py)."""

from __future__ import annotations

import pathlib
import time

import pytest

import support

pytestmark = pytest.mark.slow


def test_shut_down_pauses_and_the_next_kernel_resumes_across_a_server_restart(sandbox_server, api, tmp_path,
                                                                               monkeypatch):
    if sandbox_server.proc is None:
        pytest.skip("the server is not this session's to restart")

    from kernel.install import install_kernelspec

    spec_dir = pathlib.Path(install_kernelspec(prefix=str(tmp_path), isolation="gvisor"))
    env = support.kernel_environ(sandbox_server, tmp_path / "share" / "jupyter")
    env.pop("SANDBOX_KERNEL_ISOLATION", None)
    env.update(JPY_SESSION_NAME=str(tmp_path / "analysis.ipynb"), SANDBOX_KERNEL_STATE_DIR=str(tmp_path / "state"))
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])

    def kernel():
        return support.start_kernel(spec_dir.name, env=env, cwd=str(tmp_path), startup_timeout=120)

    km, kc = kernel()
    try:
        assert support.run_cell(kc, "df = list(range(100_000)); len(df)", timeout=180).status == "ok"
        sid = next(s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]
                   if s["metadata"].get("kernel_pid") == km.provisioner.pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    described = support.wait_for(lambda: (d := api.get(f"/v1/sandboxes/{sid}").json())["state"] == "paused" and d,
                                 timeout=60, interval=0.5)
    assert described["on_idle"] == "pause", "its idle TTL pauses it too, had the kernel not"

    sandbox_server.terminate()
    sandbox_server.start()
    assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", "re-adopted by the next server, paused"

    km, kc = kernel()
    try:
        began = time.monotonic()
        run = support.run_cell(kc, "len(df)", timeout=180)
        assert run.status == "ok", run.errors
        assert run.result_text() == "100000"
        assert sid in run.notes and "resumed from disk" in run.notes, run.notes
        assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        print(f"first cell after reopening (resume included): {time.monotonic() - began:.1f} s")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    api.delete(f"/v1/sandboxes/{sid}")
