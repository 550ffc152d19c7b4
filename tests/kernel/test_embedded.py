"""The embedded default: kernels with no URL configured find the server of their own state
directory on its unix socket, start one if none answers (only one between them), never use
another state directory's server, and a kernel killed without a shutdown has its sandbox
ended by the server at once.

Only SANDBOX_KERNEL_STATE_DIR is set (to a fresh directory): no URL, no token, no
SANDBOX_KERNEL_START_SERVER; as a user's kernel runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time

import httpx
import pytest
from support import START_TIMEOUT, make_state_dir, pid_alive, run_cell, sweep, wait_for, with_repo_on_path

import support

pytestmark = pytest.mark.slow


def stop_started_server(state_dir) -> None:
    """SIGTERM the server the kernels started (its pid is in server.json)."""
    for name in ("server.json", "server-start.pid"):
        try:
            text = (state_dir / name).read_text()
        except OSError:
            continue
        pid = json.loads(text)["pid"] if name.endswith(".json") else int(text)
        if not support.signal_server(pid, signal.SIGTERM):
            continue
        if not wait_for(lambda: not pid_alive(pid), 30):
            support.signal_server(pid, signal.SIGKILL)


def user_environ(jupyter_data, state) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    env["SANDBOX_KERNEL_STATE_DIR"] = str(state)
    env["JUPYTER_PATH"] = str(jupyter_data)
    return with_repo_on_path(env)


def sandbox_states(state) -> dict[str, str]:
    out = {}
    for d in (state / "sandboxes").iterdir():
        try:
            out[d.name] = json.loads((d / "state.json").read_text()).get("state")
        except (OSError, ValueError):
            out[d.name] = "booting"
    return out


def test_kernels_start_one_server_on_their_state_dirs_socket(jupyter_data, sandbox_server, tmp_path):

    state = make_state_dir("sbk-emb-", images_from=sandbox_server.state_dir)
    env = user_environ(jupyter_data, state)
    kernels: list = []
    try:
        # Both kernels start at once, so both look for the server at the same moment: the
        # lock must make one of them start it.
        for _ in range(2):
            km = support.kernel_manager("sandbox")
            km.start_kernel(cwd=str(tmp_path), env=env)
            kernels.append((km, km.client()))
        for _, kc in kernels:
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
        runs = [run_cell(kc, "print('ran', 6 * 7)", timeout=START_TIMEOUT) for _, kc in kernels]
        for run in runs:
            assert run.status == "ok", (run.errors, run.stderr)
            visible = run.visible()
            assert {m["msg_type"] for m in visible} == {"stream"}, visible
            assert "".join(m["content"]["text"] for m in visible) == "ran 42\n"
        log = (state / "server.log").read_text(errors="replace")
        assert log.count("--- started by kernel pid") == 1, log[-2000:]
        sock = state / "server.sock"
        mode = os.stat(sock).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
        info = json.loads((state / "server.json").read_text())
        assert info["socket"] == str(sock) and info["url"] is None, info  # no TCP unless asked
        where = run_cell(kernels[0][1], "%sandbox", timeout=60).stdout
        assert f"unix:{sock}" in where, where
        # Nothing of the kernels' went to the other server.
        with sandbox_server.client() as c:
            other = c.get("/v1/sandboxes").json()["sandboxes"]
        assert not [s for s in other if s["metadata"].get("client") == "sandbox-kernel"
                    and s["metadata"].get("kernel_pid") in {km.provisioner.process.pid for km, _ in kernels}]

        # kill -9 one kernel (as nbval does): the server ends its sandbox at once.
        ours = {i for i, st in sandbox_states(state).items() if st == "running"}
        assert len(ours) == 2, sandbox_states(state)
        km, kc = kernels.pop(0)
        kc.stop_channels()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        km.provisioner.process.wait()
        began = time.monotonic()
        ended = wait_for(lambda: [i for i in ours if sandbox_states(state)[i] != "running"], 20)
        assert len(ended) == 1, sandbox_states(state)
        print(f"sandbox of the killed kernel ended {time.monotonic() - began:.2f} s after the kill")
        log = (state / "server.log").read_text(errors="replace")
        assert f"the process that created it (pid {km.provisioner.process.pid}) exited" in log
        # The other kernel's sandbox is untouched and still works.
        assert run_cell(kernels[0][1], "print('still', 1)", timeout=60).stdout == "still 1\n"
    finally:
        for km, kc in kernels:
            kc.stop_channels()
            km.shutdown_kernel(now=False)
        stop_started_server(state)
        sweep(state)
        shutil.rmtree(state, ignore_errors=True)


def test_a_second_server_for_the_same_state_dir_refuses(sandbox_server):
    """One server per state directory: the session server's socket is live."""
    import subprocess
    import sys

    from support import REPO, server_env

    r = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--state-dir", str(sandbox_server.state_dir)],
                       cwd=str(REPO), env=server_env(None), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r
    assert f"a sandbox server already listens on {sandbox_server.state_dir}/server.sock" in r.stderr
    # and the live one still answers on its socket
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sandbox_server.state_dir / "server.sock"))) as c:
        assert c.get("http://x/v1/info").status_code == 200
