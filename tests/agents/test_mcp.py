"""`sandbox-kernel mcp`, driven by the official MCP SDK's own client, over stdio and over
streamable HTTP, on the session's sandbox server."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import typing as t

import anyio
import httpx
import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed: pip install -e '.[test]'")

import httpx2  # noqa: E402  (the mcp SDK's HTTP client)
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

import support  # noqa: E402

TOOLS = {"create_sandbox", "list_sandboxes", "delete_sandbox", "run_code", "write_file", "read_file", "list_files"}


def texts(result: t.Any) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


def mcp_sandboxes(server: support.Server) -> dict[str, dict]:
    """The sandboxes the MCP server made for sessions, as the sandbox API lists them."""
    with server.client() as c:
        listed = c.get("/v1/sandboxes").json()["sandboxes"]
    return {s["id"]: s for s in listed if (s.get("metadata") or {}).get("client") == "sandbox-kernel-mcp"}


async def exercise(client: Client, server: support.Server) -> dict[str, t.Any]:
    """The same conversation over either transport: state kept in the session's sandbox,
    errors and figures as MCP content, files, and a second, explicit sandbox."""
    seen: dict[str, t.Any] = {}
    tools = {tool.name for tool in (await client.list_tools()).tools}
    assert TOOLS <= tools, tools

    first = await client.call_tool("run_code", {"code": "import pandas as pd\nx = 6 * 7\nprint('set')"})
    assert not first.is_error and texts(first).strip() == "set", first
    again = await client.call_tool("run_code", {"code": "x + 1"})
    assert not again.is_error and texts(again).strip() == "43", again  # the session's sandbox kept x

    failed = await client.call_tool("run_code", {"code": "print('partial')\nx / 0"})
    assert failed.is_error and "ZeroDivisionError" in texts(failed) and "partial" in texts(failed), failed

    figure = await client.call_tool("run_code", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()"})
    images = [c for c in figure.content if c.type == "image"]
    assert not figure.is_error and len(images) == 1, figure
    assert images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data)[:8] == b"\x89PNG\r\n\x1a\n"

    wrote = await client.call_tool("write_file", {"path": "q/in.csv", "content": "clicks,impressions\n244658,24153312\n"})
    assert not wrote.is_error, wrote
    ctr = await client.call_tool("run_code", {"code": "df = pd.read_csv('q/in.csv')\n"
                                                     "open('q/ctr.txt', 'w').write(str(round(df.clicks[0] / df.impressions[0] * 100, 2)))"})
    assert not ctr.is_error, ctr
    listed = json.loads(texts(await client.call_tool("list_files", {})))
    assert {"path": "q/ctr.txt", "size": 4, "type": "file"} in listed["files"], listed
    assert texts(await client.call_tool("read_file", {"path": "q/ctr.txt"})) == "1.01"
    missing = await client.call_tool("read_file", {"path": "../etc/passwd"})
    assert missing.is_error and "sandbox server:" in texts(missing), missing

    made = json.loads(texts(await client.call_tool("create_sandbox", {"ttl_seconds": 300})))
    other = made["sandbox_id"]
    fresh = await client.call_tool("run_code", {"code": "x", "sandbox_id": other})
    assert fresh.is_error and "NameError" in texts(fresh), fresh  # its own interpreter
    every = json.loads(texts(await client.call_tool("list_sandboxes", {})))
    assert other in {s["sandbox_id"] for s in every["sandboxes"]}
    deleted = await client.call_tool("delete_sandbox", {"sandbox_id": other})
    assert not deleted.is_error, deleted
    gone = await client.call_tool("run_code", {"code": "1", "sandbox_id": other})
    assert gone.is_error and "deleted" in texts(gone), gone
    seen["session_sandboxes"] = {i for i, s in mcp_sandboxes(server).items() if s["metadata"].get("mcp_session") != "create_sandbox"}
    return seen


def test_mcp_over_stdio(sandbox_server: support.Server) -> None:
    env = support.server_env(sandbox_server.token, {"SANDBOX_KERNEL_URL": sandbox_server.url})
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandbox", "mcp"], env=env, cwd=str(support.REPO))
    before = set(mcp_sandboxes(sandbox_server))

    async def main() -> dict[str, t.Any]:
        async with Client(params, read_timeout_seconds=120) as client:
            return await exercise(client, sandbox_server)

    seen = anyio.run(main)
    session_sandboxes = seen["session_sandboxes"] - before
    assert len(session_sandboxes) == 1, seen  # one session, one sandbox
    # The client closed stdio: the server stopped and deleted its session's sandbox.
    assert support.wait_for(lambda: not (session_sandboxes & set(mcp_sandboxes(sandbox_server))), 30)


@pytest.fixture
def mcp_http(sandbox_server: support.Server) -> t.Iterator[str]:
    port = support.free_port()
    env = support.server_env(sandbox_server.token, {"SANDBOX_KERNEL_URL": sandbox_server.url})
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "mcp", "--transport", "http", "--port", str(port)],
                            cwd=str(support.REPO), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        try:
            httpx.get(url, timeout=2)
            return True
        except httpx.TransportError:
            return proc.poll() is not None

    try:
        assert support.wait_for(up, 60) and proc.poll() is None, proc.stdout.read() if proc.poll() is not None else "no answer"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_mcp_over_http_needs_the_token(sandbox_server: support.Server, mcp_http: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(mcp_http, json=body, headers=headers, timeout=30)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"] == "Bearer"

    async def main() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http:
            with pytest.raises(Exception):
                async with Client(streamable_http_client(mcp_http, http_client=http), read_timeout_seconds=30) as client:
                    await client.list_tools()

    anyio.run(main)


def test_mcp_over_http_session_keeps_its_sandbox(sandbox_server: support.Server, mcp_http: str) -> None:
    """A session-based client (the handshake protocol, Mcp-Session-Id) gets one sandbox for
    its session; a stateless client is told to create one and pass its id, and can."""
    auth = {"Authorization": f"Bearer {sandbox_server.token}"}
    before = set(mcp_sandboxes(sandbox_server))

    async def session_client() -> dict[str, t.Any]:
        async with httpx2.AsyncClient(headers=auth, timeout=120) as http:
            async with Client(streamable_http_client(mcp_http, http_client=http), mode="legacy",
                              read_timeout_seconds=120) as client:
                return await exercise(client, sandbox_server)

    seen = anyio.run(session_client)
    assert len(seen["session_sandboxes"] - before) == 1, seen

    async def stateless_client() -> None:
        async with httpx2.AsyncClient(headers=auth, timeout=120) as http:
            async with Client(streamable_http_client(mcp_http, http_client=http), read_timeout_seconds=120) as client:
                refused = await client.call_tool("run_code", {"code": "1 + 1"})
                assert refused.is_error and "create_sandbox" in texts(refused), refused
                sid = json.loads(texts(await client.call_tool("create_sandbox", {})))["sandbox_id"]
                await client.call_tool("run_code", {"code": "y = 5", "sandbox_id": sid})
                kept = await client.call_tool("run_code", {"code": "y * 2", "sandbox_id": sid})
                assert texts(kept).strip() == "10", kept
                await client.call_tool("delete_sandbox", {"sandbox_id": sid})

    anyio.run(stateless_client)


def test_mcp_run_command_follows_the_client(sandbox_server: support.Server) -> None:
    """run_command is listed exactly when the client can run commands; then it reports the
    exit code and both streams, and a failing command is an isError result."""
    from sandbox.agents.mcp_server import SandboxMCP, build_server, has_commands
    from sandbox.client import resolve

    async def main() -> tuple[set[str], t.Any]:
        state = SandboxMCP(resolve(sandbox_server.url, sandbox_server.token), ttl_seconds=300)
        try:
            async with Client(build_server(state)) as client:  # in process: the SDK's own client
                names = {tool.name for tool in (await client.list_tools()).tools}
                if "run_command" not in names:
                    return names, None
                await client.call_tool("write_file", {"path": "in.txt", "content": "a\nb\n"})
                return names, await client.call_tool("run_command", {"command": "wc -l < in.txt; echo oops >&2; exit 3"})
        finally:
            await state.close()

    names, result = anyio.run(main)
    assert ("run_command" in names) == has_commands(), names
    if result is None:
        pytest.skip("the client has no commands yet (sbx.commands, issue 16 item 1): run_command is not offered")
    body = json.loads(texts(result))
    assert result.is_error and body["exit_code"] == 3 and body["timed_out"] is False, body
    assert body["stdout"].strip() == "2" and body["stderr"].strip() == "oops", body
