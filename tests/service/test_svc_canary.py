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
import stat
import types

import httpx
import pytest

from support import Server, descendants, make_state_dir, ok
from svc_support import last_json_line

CANARY_NAME = "SANDBOX_CANARY_SECRET"


def environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def canary_server(sandbox_server):
    canary = "canary-" + secrets.token_hex(16)
    state = make_state_dir("sbk-canary-", images_from=sandbox_server.state_dir)
    server = Server(state, "--pool-size", "0", token=None, extra_env={CANARY_NAME: canary}, start_timeout=300)
    try:
        print(f"canary server up in {server.start():.1f} s")
        yield types.SimpleNamespace(server=server, canary=canary, url=server.url, state_dir=state, pid=server.proc.pid)
    finally:
        server.close()


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
            # Host side: the sandbox's supervisor and everything under it, whose environments
            # the sandbox cannot read, hold no canary either (each is one filter deep).
            supervisor = json.loads((canary_server.state_dir / "sandboxes" / sid / "state.json").read_text())["supervisor_pid"]
            host_side = {pid: environ_of(pid) for pid in descendants(supervisor) | {supervisor}}
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
    assert len(host_side) >= 3 and b"PATH=" in host_side[supervisor], host_side  # supervisor, bwrap, runtime
    for pid, environ in host_side.items():
        assert canary.encode() not in environ and CANARY_NAME.encode() not in environ, (pid, environ)
        assert token.encode() not in environ, pid
    # control for the probe itself: it did read a real environment (its own)
    assert "PATH=" in probe["procs"]["self"] and probe["environ"]["HOME"] == "/tmp"
