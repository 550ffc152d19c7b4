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

TOOLS = {"create_sandbox", "list_sandboxes", "delete_sandbox", "run_code", "write_file", "read_file", "list_files",
         "save_sandbox"}


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

    saved = json.loads(texts(await client.call_tool("save_sandbox", {"label": "task-1"})))
    assert {"x", "df"} <= {i["name"] for i in saved["summary"]["saved"]}, saved  # the session's variables
    back = json.loads(texts(await client.call_tool("create_sandbox", {"from_save": saved["save_id"]})))
    assert {"x", "df"} <= {i["name"] for i in back["restored"]["restored"]}, back
    assert texts(await client.call_tool("run_code", {"code": "x", "sandbox_id": back["sandbox_id"]})).strip() == "42"
    await client.call_tool("delete_sandbox", {"sandbox_id": back["sandbox_id"]})
    with server.client() as c:
        c.delete(f"/v1/saves/{saved['save_id']}")

    made = json.loads(texts(await client.call_tool("create_sandbox", {"ttl_seconds": 300})))
    other = made["sandbox_id"]
    fresh = await client.call_tool("run_code", {"code": "x", "sandbox_id": other})
    assert fresh.is_error and "NameError" in texts(fresh), fresh  # its own interpreter
    every = json.loads(texts(await client.call_tool("list_sandboxes", {})))
    assert other in {s["sandbox_id"] for s in every["sandboxes"]}
    usage = next(s["usage"] for s in every["sandboxes"] if s["sandbox_id"] == other)
    assert usage["memory_bytes"] > 0 and usage["memory_limit_bytes"] > usage["memory_bytes"], usage
    deleted = await client.call_tool("delete_sandbox", {"sandbox_id": other})
    assert not deleted.is_error, deleted
    gone = await client.call_tool("run_code", {"code": "1", "sandbox_id": other})
    assert gone.is_error and "deleted" in texts(gone), gone
    seen["session_sandboxes"] = {i for i, s in mcp_sandboxes(server).items() if s["metadata"].get("mcp_session") != "create_sandbox"}
    return seen


@pytest.mark.slow
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


@pytest.mark.slow
def test_mcp_over_http_session_keeps_its_sandbox(sandbox_server: support.Server, mcp_http: str) -> None:
    """A session-based client (the handshake protocol, Mcp-Session-Id) gets one sandbox for
    its session; a stateless client (no session id) has the same conversation as a stdio
    client, on the server's default sandbox: both transports behave the same."""
    auth = {"Authorization": f"Bearer {sandbox_server.token}"}
    before = set(mcp_sandboxes(sandbox_server))

    async def conversation(mode: str) -> dict[str, t.Any]:
        async with httpx2.AsyncClient(headers=auth, timeout=120) as http:
            async with Client(streamable_http_client(mcp_http, http_client=http), mode=mode,
                              read_timeout_seconds=120) as client:
                return await exercise(client, sandbox_server)

    seen = anyio.run(conversation, "legacy")
    assert len(seen["session_sandboxes"] - before) == 1, seen
    stateless = anyio.run(conversation, "auto")  # the SDK's default: the stateless protocol
    made = stateless["session_sandboxes"] - seen["session_sandboxes"] - before
    assert len(made) == 1, stateless  # the default sandbox, made on first use like stdio's


@pytest.mark.slow
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


# ------------------------------------------------------------------------ red team: reach

SCOPED_ROUTES = (("GET", ""), ("POST", "/execute"), ("GET", "/files"), ("GET", "/files/secret.txt"),
                 ("PUT", "/files/planted.txt"), ("DELETE", "/files/secret.txt"), ("POST", "/renew"),
                 ("DELETE", ""))


def as_scope(server: support.Server, scope: str | None) -> httpx.Client:
    """A client of the sandbox server declaring ``scope`` (None: none), as an agent's tools do."""
    headers = {**server.headers, **({"Sandbox-Scope": scope} if scope else {})}
    return httpx.Client(base_url=server.url, headers=headers, timeout=httpx.Timeout(30, read=120))


def probe_routes(server: support.Server, sandbox_id: str, scope: str | None) -> dict[str, int]:
    """Every per-sandbox route tried on ``sandbox_id`` as a caller declaring ``scope``
    (None: none), and the listing: the status of each (the DELETE last)."""
    seen = {}
    with as_scope(server, scope) as c:
        listed = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        seen["listed"] = 200 if sandbox_id in listed else 404
        for method, tail in SCOPED_ROUTES[:-1]:
            body = {"json": {"code": "1"}} if tail == "/execute" else {"json": {}} if tail == "/renew" else \
                {"content": b"x"} if method == "PUT" else {}
            seen[f"{method} {tail or '/'}"] = c.request(method, f"/v1/sandboxes/{sandbox_id}{tail}", **body).status_code
    return seen


def test_an_agent_reaches_only_its_own_sandboxes(sandbox_server: support.Server) -> None:
    """Red team: an agent over MCP lists sandboxes and passes the id of the user's notebook
    sandbox to every tool. The sandbox server (not the tool) refuses each as an unknown id,
    leaves it out of listings, and the notebook's variables are untouched. Controls: the same
    requests without a declared scope reach it (the probe would notice a missing check), and
    an MCP server started with an explicit ``--reach '*'`` reads its variable."""
    from sandbox.agents.mcp_server import SandboxMCP, build_server, scoped
    from sandbox.client import resolve

    with sandbox_server.client() as c:
        notebook = support.create(c, ttl_seconds=300)["id"]
        support.execute(c, notebook, "secret = 'the user data'\nopen('secret.txt', 'w').write(secret)")

    async def agent(reach: tuple[str, ...]) -> dict[str, t.Any]:
        config = scoped(resolve(sandbox_server.url, sandbox_server.token), None, reach)
        state = SandboxMCP(config, ttl_seconds=300)
        try:
            async with Client(build_server(state, with_commands=False)) as client:
                own = json.loads(texts(await client.call_tool("create_sandbox", {})))["sandbox_id"]
                listed = json.loads(texts(await client.call_tool("list_sandboxes", {})))
                calls = {name: await client.call_tool(name, {"sandbox_id": notebook, **args}) for name, args in (
                    ("run_code", {"code": "secret"}), ("read_file", {"path": "secret.txt"}),
                    ("list_files", {}), ("write_file", {"path": "planted.txt", "content": "x"}),
                    ("delete_sandbox", {}))}
                return {"own": own, "scope": config.scope, "listed": {s["sandbox_id"] for s in listed["sandboxes"]},
                        "calls": calls}
        finally:
            await state.close()

    try:
        seen = anyio.run(agent, ())
        assert seen["listed"] == {seen["own"]}, seen["listed"]
        for name, result in seen["calls"].items():
            assert result.is_error and f"no sandbox with id {notebook!r}" in texts(result), (name, result)
        # The server's rule, not the tool's: each route as the agent's scope is a 404.
        refused = probe_routes(sandbox_server, notebook, seen["scope"].split(",")[0])
        assert set(refused.values()) == {404}, refused
        with sandbox_server.client() as c:
            assert support.result_text(support.execute(c, notebook, "secret")) == "'the user data'"
            r = c.get(f"/v1/sandboxes/{notebook}/files")
            assert [f["path"] for f in r.json()["files"]] == ["secret.txt"], r.text  # nothing planted
            assert c.get(f"/v1/sandboxes/{notebook}").json()["scope"] is None
        # Control 1: the same requests without a scope reach the notebook's sandbox.
        reached = probe_routes(sandbox_server, notebook, None)
        assert reached["listed"] == 200 and reached["GET /"] == 200 and reached["GET /files/secret.txt"] == 200, reached
        # Control 2: an agent started with an explicit --reach '*' reads the variable.
        wide = anyio.run(agent, ("*",))
        assert texts(wide["calls"]["run_code"]).strip() == "'the user data'", wide["calls"]["run_code"]
        assert notebook in wide["listed"]
    finally:
        with sandbox_server.client() as c:
            c.delete(f"/v1/sandboxes/{notebook}")


def test_a_scope_label_is_kept_and_named_scopes_are_reachable(sandbox_server: support.Server) -> None:
    """A sandbox made under scope A is labelled A; scope B cannot reach it unless B names A
    (``--reach A``); a malformed scope is a 400, not a silent unscoped caller."""
    with as_scope(sandbox_server, "agent-a") as a:
        made = support.create(a, ttl_seconds=120)
        assert made["scope"] == "agent-a", made
        sid = made["id"]
        assert a.get(f"/v1/sandboxes/{sid}").json()["scope"] == "agent-a"
    try:
        with as_scope(sandbox_server, "agent-b") as b:
            assert b.get(f"/v1/sandboxes/{sid}").status_code == 404
            assert sid not in {s["id"] for s in b.get("/v1/sandboxes").json()["sandboxes"]}
        with as_scope(sandbox_server, "agent-b, agent-a") as b:
            assert b.get(f"/v1/sandboxes/{sid}").status_code == 200
        with as_scope(sandbox_server, "bad scope!") as bad:
            r = bad.get("/v1/sandboxes")
            assert r.status_code == 400 and "Sandbox-Scope" in r.json()["error"]["message"], r.text
            assert bad.post("/v1/sandboxes", json={}).status_code == 400
    finally:
        with sandbox_server.client() as c:
            c.delete(f"/v1/sandboxes/{sid}")


def test_read_file_is_bounded_by_apparent_size(sandbox_server: support.Server) -> None:
    """Red team: a 1 GB sparse file (no space used in the sandbox) read over MCP. The server
    refuses the download by its apparent size (413, before a byte streams) and read_file
    says so, without bringing it into the MCP process; a 50 MB one, under the server's cap,
    is refused by read_file's own count. Control: a sparse file under both caps streams
    whole (its zeros are the bytes that travel), so a cap that stopped counting is noticed."""
    from sandbox.agents.mcp_server import SandboxMCP, build_server, scoped
    from sandbox.agents.transcript import READ_MAX_BYTES
    from sandbox.client import resolve

    async def main() -> dict[str, t.Any]:
        state = SandboxMCP(scoped(resolve(sandbox_server.url, sandbox_server.token)), ttl_seconds=300)
        try:
            async with Client(build_server(state, with_commands=False)) as client:
                await client.call_tool("run_code", {"code": (
                    "for name, size in (('huge.bin', 1 << 30), ('mid.bin', 50 << 20), ('small.bin', 3 << 20)):\n"
                    "    with open(name, 'wb') as f: f.truncate(size)")})
                seen = {name: await client.call_tool("read_file", {"path": name})
                        for name in ("huge.bin", "mid.bin", "small.bin")}
                sid = next(iter(state.session_sandboxes.values())).id
                with as_scope(sandbox_server, state.config.scope) as c:
                    seen["raw_huge"] = c.get(f"/v1/sandboxes/{sid}/files/huge.bin")
                    seen["raw_small"] = c.get(f"/v1/sandboxes/{sid}/files/small.bin")
                return seen
        finally:
            await state.close()

    seen = anyio.run(main)
    for name in ("huge.bin", "mid.bin"):
        assert seen[name].is_error and f"up to {READ_MAX_BYTES} bytes" in texts(seen[name]), seen[name]
    huge = seen["raw_huge"]
    assert huge.status_code == 413 and huge.json()["error"]["size"] == 1 << 30, huge.text[:300]
    # Control: under the caps, the sparse file's apparent bytes are what arrives.
    assert not seen["small.bin"].is_error and texts(seen["small.bin"]).startswith("\0" * 1000)
    assert seen["raw_small"].status_code == 200 and len(seen["raw_small"].content) == 3 << 20
