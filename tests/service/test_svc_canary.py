"""Secrets of the server stay outside its sandboxes.

The session's server cannot be given a planted variable after it started, so this module
runs a second, dedicated server whose environment holds a random canary and no token (so
it generates its token file, which is checked too). Cost: it reuses the session server's
built image by copying only that image's ``image.json`` (absolute paths to the read-only
venv and interpreter copy) into its own state directory, so no second image build (~35 s)
is paid; its pool is off, so it starts in about a second.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import time
import types

import httpx
import pytest

import sandbox_test_support as support
from svc_support import last_json_line, ok

CANARY_NAME = "SANDBOX_CANARY_SECRET"


@pytest.fixture(scope="module")
def canary_server(sandbox_server):
    canary = "canary-" + secrets.token_hex(16)
    state = support.make_state_dir("sbk-canary-")
    image_json = sandbox_server.state_dir / "images" / "default" / "image.json"
    if image_json.exists():
        (state / "images" / "default").mkdir(parents=True)
        shutil.copy(image_json, state / "images" / "default" / "image.json")
    env = support.with_repo_on_path(dict(os.environ))
    for name in ("SANDBOX_KERNEL_TOKEN", "SANDBOX_KERNEL_URL", "SANDBOX_KERNEL_STATE_DIR"):
        env.pop(name, None)
    env[CANARY_NAME] = canary
    port = support.free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = state / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "serve", "--port", str(port), "--state-dir", str(state), "--pool-size", "0"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(support.REPO),
            start_new_session=True)
    server = support.TestServer(url, "", state, proc, log_path, owns_state_dir=True)
    t0 = time.monotonic()
    try:
        while not support.healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"the canary server exited with {proc.returncode}:\n{server.log_tail()}")
            if time.monotonic() - t0 > 300:
                pytest.fail(f"the canary server did not start:\n{server.log_tail()}")
            time.sleep(0.2)
        print(f"canary server up in {time.monotonic() - t0:.1f} s")
        server.token = (state / "token").read_text().strip()
        yield types.SimpleNamespace(server=server, canary=canary, url=url, state_dir=state, pid=proc.pid)
    finally:
        support.stop_server(server)


def test_generated_token_file_is_private(canary_server):
    token_file = canary_server.state_dir / "token"
    st = token_file.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert st.st_uid == os.geteuid()
    token = canary_server.server.token
    assert len(token) >= 32
    # the file's token is the one the server checks
    assert httpx.get(canary_server.url + "/v1/sandboxes").status_code == 401
    r = httpx.get(canary_server.url + "/v1/sandboxes", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200


def test_server_environment_is_not_visible_inside(canary_server):
    canary = canary_server.canary
    token = canary_server.server.token
    # control: the canary really is in the server's environment
    with open(f"/proc/{canary_server.pid}/environ", "rb") as f:
        assert f"{CANARY_NAME}={canary}".encode() in f.read().split(b"\0")

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=canary_server.url, headers=headers, timeout=120) as client:
        r = client.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            events = []
            code = "\n".join([
                "import json, os",
                "def read(path):",
                "    try:",
                "        with open(path, 'rb') as f:",
                "            return f.read().decode('utf-8', 'replace')",
                "    except OSError as exc:",
                "        return 'unreadable: ' + type(exc).__name__",
                "procs = {p: read(f'/proc/{p}/environ') for p in os.listdir('/proc') if p.isdigit()}",
                "procs['self'] = read('/proc/self/environ')",
                "print(json.dumps({'environ': dict(os.environ), 'pid1': read('/proc/1/environ'), 'procs': procs}))",
            ])
            with client.stream("POST", f"/v1/sandboxes/{sid}/execute", json={"code": code}) as stream:
                assert stream.status_code == 200
                for line in stream.iter_lines():
                    if line:
                        events.append(json.loads(line))
            probe = last_json_line(ok(events))
        finally:
            client.delete(f"/v1/sandboxes/{sid}")

    print("pid 1 environ inside:", probe["pid1"][:200])
    print("environ readable inside for pids:", sorted(p for p, v in probe["procs"].items() if not v.startswith("unreadable")))
    assert CANARY_NAME not in probe["environ"]
    assert canary not in repr(probe["environ"].values())
    assert canary not in probe["pid1"] and CANARY_NAME not in probe["pid1"]
    for pid, text in probe["procs"].items():
        assert canary not in text and CANARY_NAME not in text, pid
        assert token not in text, pid
    assert token not in repr(probe["environ"].values())
    # control for the probe itself: it did read a real environment (its own)
    assert "PATH=" in probe["procs"]["self"] and probe["environ"]["HOME"] == "/tmp"
