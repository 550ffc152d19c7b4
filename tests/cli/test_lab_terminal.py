"""What `sandbox-kernel lab` prints in its terminal while a kernel starts and runs a cell:
JupyterLab's own lines, and none of the kernel's noise that ipykernel users never see.

- debugpy's four "Debugger warning: It seems that frozen modules are being used" lines:
  ipykernel's kernel_info imports its debugger to list it as a feature; this kernel answers
  kernel_info without it (it has no debugger) and so never imports debugpy.
- ipykernel's "Kernel is running over TCP without encryption", once per kernel: `lab` has
  JupyterLab give kernels CurveZMQ keys (the kernelspecs declare supported_encryption), so
  the kernel's sockets are encrypted; the keys are in its connection file.

Each has a control: the same interpreter importing ipykernel's debugger prints the lines,
and the same kernelspec started without keys (jupyter_client's default) prints the warning.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
import sys

import httpx
import pytest

import support
from sandbox.service.server_process import ServerProcess
from support import REPO, run_cell, wait_for

pytestmark = pytest.mark.slow

FROZEN = "frozen modules"
PLAINTEXT = "running over TCP without encryption"


def _kernel_env(server: support.Server, workdir: pathlib.Path) -> dict[str, str]:
    """The kernel on the session's server (never starting one), Jupyter's files in `workdir`."""
    env = support.with_repo_on_path(dict(os.environ))
    env.update(server.env, SANDBOX_KERNEL_START_SERVER="0", SANDBOX_KERNEL_STATE_DIR=str(workdir / "state"))
    for name in ("config", "runtime", "data"):
        (workdir / name).mkdir(exist_ok=True)
    env.update(JUPYTER_CONFIG_DIR=str(workdir / "config"), JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(workdir / "config"), JUPYTERLAB_WORKSPACES_DIR=str(workdir / "config"))
    env.pop("JUPYTER_TOKEN", None)
    return env


def _answers(url: str, token: str) -> bool:
    try:
        return httpx.get(url, params={"token": token}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _kernel_client(connection: pathlib.Path):
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_file(str(connection))
    # A loaded host's late heart is not a dead kernel; set before the channel starts, or its
    # first wait is the default second.
    kc.hb_channel.time_to_dead = 20.0
    kc.start_channels()
    kc.wait_for_ready(timeout=300)
    return kc


def test_lab_prints_no_debugger_lines_and_no_plaintext_warning(sandbox_server, tmp_path):
    pytest.importorskip("jupyterlab")
    env = _kernel_env(sandbox_server, tmp_path)
    port, token = support.free_port(), secrets.token_hex(16)
    log = tmp_path / "lab.log"
    lab = ServerProcess([sys.executable, "-m", "sandbox", "lab", "--port", str(port), str(tmp_path),
                         f"--ServerApp.token={token}", "--ServerApp.password=", "--LabApp.news_url=None"],
                        log, env=env, cwd=tmp_path)
    lab.start()
    base = f"http://127.0.0.1:{port}"
    try:
        lab.wait_ready(lambda: _answers(f"{base}/api/kernelspecs", token), 180, interval=0.5, tail_lines=40,
                       name="JupyterLab")
        r = httpx.post(f"{base}/api/kernels", params={"token": token}, json={"name": "sandbox"}, timeout=120)
        assert r.status_code == 201, r.text
        connection = tmp_path / "runtime" / f"kernel-{r.json()['id']}.json"
        assert wait_for(connection.exists, 60), log.read_text()[-3000:]
        keys = json.loads(connection.read_text())
        assert keys.get("curve_serverkey") or keys.get("curve_publickey"), sorted(keys)  # encrypted sockets
        kc = _kernel_client(connection)
        try:
            info = support.shell_request(kc, "kernel_info")
            assert "debugger" not in info["supported_features"], info  # it has none, and says so
            cell = run_cell(kc, "print(6 * 7)", timeout=300)
            assert cell.status == "ok" and cell.stdout == "42\n", cell.outputs
        finally:
            kc.stop_channels()
        httpx.post(f"{base}/api/shutdown", params={"token": token}, timeout=60)
        assert lab.proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        lab.stop(30)
    output = log.read_text(errors="replace")
    assert "Kernel started" in output, output[-3000:]  # the log holds the kernel's time
    assert FROZEN not in output and PLAINTEXT not in output, output[-3000:]


def test_the_controls_each_line_is_printed_without_its_fix(sandbox_server, tmp_path):
    """The probes above can fire: ipykernel's debugger, imported by this interpreter, prints
    the frozen-modules lines; the same kernelspec started by jupyter_client's default, with
    no keys, prints the plaintext warning."""
    from jupyter_client import KernelManager

    imported = subprocess.run([sys.executable, "-c", "import ipykernel.debugger"], capture_output=True, text=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if k != "PYDEVD_DISABLE_FILE_VALIDATION"})
    if sys.version_info >= (3, 11) and sys._xoptions.get("frozen_modules") != "off":
        assert FROZEN in imported.stderr, imported.stderr
    else:
        print(f"this interpreter has no frozen modules: no control for {FROZEN!r}")

    env = _kernel_env(sandbox_server, tmp_path)
    subprocess.run([sys.executable, "-m", "kernel.install", "--prefix", str(tmp_path / "prefix")], check=True,
                   env=env, cwd=REPO, capture_output=True, timeout=120)
    env["JUPYTER_PATH"] = str(tmp_path / "prefix" / "share" / "jupyter")
    stderr = tmp_path / "kernel.err"
    km = KernelManager(kernel_name="sandbox")
    km.kernel_spec_manager.kernel_dirs = [env["JUPYTER_PATH"] + "/kernels"]
    with open(stderr, "w") as err:
        km.start_kernel(env=env, stderr=err, cwd=str(tmp_path))
    try:
        assert km.transport_encryption == "disabled"
        assert wait_for(lambda: PLAINTEXT in stderr.read_text(), 60, interval=0.2), stderr.read_text()
    finally:
        km.shutdown_kernel(now=True)
