"""The embedded default: kernels that find no server start one, and only one between them.

Uses its own port and state directory (SANDBOX_KERNEL_START_SERVER=1 lets the kernel
start a server for a configured loopback URL, as it does for the default one), so that
it never touches a server on the real default port.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest
from support import START_TIMEOUT, Server, kernel_environ, make_state_dir, run_cell, sweep, with_repo_on_path

pytestmark = pytest.mark.slow


def stop_started_server(url: str, state_dir) -> None:
    token_file = state_dir / "token"
    if token_file.exists():
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        try:
            for sbx in httpx.get(url + "/v1/sandboxes", headers=headers, timeout=10).json().get("sandboxes", []):
                httpx.delete(f"{url}/v1/sandboxes/{sbx['id']}", headers=headers, timeout=30)
        except (httpx.HTTPError, ValueError):
            pass
    pid_file = state_dir / "server-start.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_two_kernels_start_one_server_and_both_work(jupyter_data, sandbox_server, tmp_path):
    from jupyter_client.manager import KernelManager

    state = make_state_dir("sbk-test-embedded-", images_from=sandbox_server.state_dir)
    server = Server(state)  # where the kernels will start theirs: never started here
    url = server.url
    env = kernel_environ(server, jupyter_data)
    env.pop("SANDBOX_KERNEL_TOKEN", None)  # the kernels must find the server's token file
    env.update(SANDBOX_KERNEL_START_SERVER="1", SANDBOX_KERNEL_STATE_DIR=str(state))
    env = with_repo_on_path(env)

    kernels: list = []
    try:
        # Both kernels start at once (a launch returns before the kernel is up), so both
        # look for the server at the same moment: the lock must make one of them start it.
        for _ in range(2):
            km = KernelManager(kernel_name="sandbox")
            km.start_kernel(cwd=str(tmp_path), env=env)
            kernels.append((km, km.client()))
        for _, kc in kernels:
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
        runs = []
        for _, kc in kernels:
            runs.append(run_cell(kc, "print('ran', 6 * 7)", timeout=START_TIMEOUT))
        for run in runs:
            assert run.status == "ok", (run.errors, run.stderr)
            # Startup progress, if the wait was long enough to show any, is cleared: the
            # saved notebook holds the cell's own output only.
            visible = run.visible()
            assert {m["msg_type"] for m in visible} == {"stream"}, visible
            assert "".join(m["content"]["text"] for m in visible) == "ran 42\n"
        log = (state / "server.log").read_text(errors="replace")
        assert log.count("--- started by kernel pid") == 1, log[-2000:]
        assert (state / "token").exists()
    finally:
        for km, kc in kernels:
            kc.stop_channels()
            km.shutdown_kernel(now=False)
        stop_started_server(url, state)
        sweep(state)
        shutil.rmtree(state, ignore_errors=True)
