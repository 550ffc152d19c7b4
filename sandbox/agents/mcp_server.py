"""``sandbox-kernel mcp``: the sandboxes as a Model Context Protocol server.

Built on the official ``mcp`` SDK's ``MCPServer`` (``pip install 'sandbox-kernel[mcp]'``).
It is a client of a sandbox server (SANDBOX_KERNEL_URL / SANDBOX_KERNEL_TOKEN, as for the
Python client) and offers its clients tools to create, list and delete sandboxes, run code
(text, the error, figures as image content), run a command, and write, read and list files.

What it may reach: only the sandboxes it created. It declares a scope on every request
(``Sandbox-Scope``, sandbox/service/scopes.py; ``--scope``, default a new ``mcp-XXXXXXXX`` per start):
the sandbox server labels what it creates with it, lists only those, and answers any other
id (the user's notebook sandbox, another agent's) as unknown. ``--reach SCOPE`` names
further scopes it may reach, ``--reach '*'`` every sandbox the token reaches.

Which sandbox a tool call uses: the ``sandbox_id`` argument if given; otherwise the MCP
session's own sandbox, created on its first use and kept, with its variables, for the
session's later calls. Over stdio the session is the connection (the process); over
streamable HTTP it is the ``Mcp-Session-Id`` of a session-based (handshake) client, and a
client on the stateless protocol (no session id) uses the server's own default sandbox,
as a stdio client does: both transports answer the same calls the same way. Session
sandboxes end when the server stops, or by their TTL (renewed by every run) if a session is
simply abandoned.

Over HTTP the server answers only requests carrying the same bearer token as the sandbox
API (``Authorization: Bearer <token>``), checked in constant time before the SDK sees them.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import logging
import secrets
import typing as t
from dataclasses import dataclass, field

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent

from ..client import AsyncSandbox, InvalidRequest, SandboxError, ServerConfig, resolve
from ..runtime import vocabulary as V
from .transcript import READ_MAX_BYTES, Transcript, agent_usage, cap, read_refusal

__all__ = ["SandboxMCP", "build_server", "serve_http", "serve_stdio"]

log = logging.getLogger(__name__)

DEFAULT_SESSION = "default"  # stdio's one connection, and HTTP clients without a session
INSTRUCTIONS = (
    "Stateful Python sandboxes: isolated, no network, files in /workspace. Variables, imports and "
    "files persist between run_code calls on the same sandbox. Without sandbox_id, a tool uses this "
    "session's sandbox (made on first use); create_sandbox makes more, to pass by sandbox_id."
)


def scoped(config: ServerConfig, scope: str | None = None, reach: t.Sequence[str] = ()) -> ServerConfig:
    """``config`` declaring a scope (a new ``mcp-XXXXXXXX`` if none is named) and what else it reaches."""
    own = scope or f"mcp-{secrets.token_hex(4)}"
    return dataclasses.replace(config, scope=", ".join([own, *reach]))


@dataclass
class SandboxMCP:
    """The MCP server's state: its sandbox server (with its scope), and the session -> sandbox map."""

    config: ServerConfig
    image: str | None = None
    ttl_seconds: int = 1800
    session_sandboxes: dict[str, AsyncSandbox] = field(default_factory=dict)
    _creating: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def create(self, image: str | None = None, ttl_seconds: int | None = None, origin: str = "",
                     from_save: str | None = None) -> AsyncSandbox:
        return await AsyncSandbox.create(image=image or self.image, ttl_seconds=ttl_seconds or self.ttl_seconds,
                                         metadata={"client": "sandbox-kernel-mcp", "mcp_session": origin},
                                         config=self.config, from_save=from_save)

    async def sandbox(self, ctx: Context | None, sandbox_id: str) -> AsyncSandbox:
        """The sandbox a call names, else its session's (made on first use)."""
        if sandbox_id:
            for sbx in self.session_sandboxes.values():
                if sbx.id == sandbox_id:
                    return sbx
            return AsyncSandbox(sandbox_id, config=self.config)
        key = session_key(ctx)
        async with self._creating:
            sbx = self.session_sandboxes.get(key)
            if sbx is None:
                sbx = self.session_sandboxes[key] = await self.create(origin=key)
        return sbx

    def release(self, sbx: AsyncSandbox) -> bool:
        """Forget a sandbox if a session owns it; True if one did."""
        for key, owned in list(self.session_sandboxes.items()):
            if owned.id == sbx.id:
                del self.session_sandboxes[key]
                return True
        return False

    async def close(self) -> None:
        """Delete every session sandbox (the server is stopping)."""
        sandboxes, self.session_sandboxes = list(self.session_sandboxes.values()), {}
        for sbx in sandboxes:
            try:
                await sbx.delete()
            except SandboxError as exc:
                log.warning("could not delete sandbox %s: %s", sbx.id, exc)
            finally:
                await sbx.close()


def session_key(ctx: Context | None) -> str:
    headers = ctx.headers if ctx is not None else None
    session_id = headers.get("mcp-session-id") if headers is not None else None
    return "http:" + session_id if session_id else DEFAULT_SESSION


def _text(text: str, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)


def _json(value: t.Any) -> CallToolResult:
    return _text(json.dumps(value, indent=1, default=str))


def refusals_as_results(tool: t.Callable[..., t.Awaitable[CallToolResult]]) -> t.Callable[..., t.Awaitable[CallToolResult]]:
    """A refusal the model can act on (is_error content), never a traceback."""
    @functools.wraps(tool)
    async def guarded(*args: t.Any, **kwargs: t.Any) -> CallToolResult:
        try:
            return await tool(*args, **kwargs)
        except SandboxError as exc:
            return _text(f"sandbox server: {exc.message}", error=True)
    return guarded


class Tools:
    """The tools over one `SandboxMCP`; each docstring is what the model reads."""

    def __init__(self, state: SandboxMCP) -> None:
        self.state = state

    @refusals_as_results
    async def create_sandbox(self, image: str = "", ttl_seconds: int = 0, from_save: str = "") -> CallToolResult:
        """Create a new sandbox (a stateful Python interpreter with its own /workspace) and
        return its sandbox_id, to pass to the other tools. Optional: image name, ttl_seconds,
        from_save (a save_id from save_sandbox: its variables are loaded, and `restored` says
        what came back and what did not)."""
        sbx = await self.state.create(image or None, ttl_seconds or None, origin="create_sandbox",
                                      from_save=from_save or None)
        try:
            info = sbx.info
            made = {"sandbox_id": sbx.id, "image": info.image, "expires_at": info.expires_at}
            return _json({**made, "restored": info.restored} if info.restored is not None else made)
        finally:
            await sbx.close()

    @refusals_as_results
    async def list_sandboxes(self) -> CallToolResult:
        """List the live sandboxes of this server: id, image, state, expiry, and what each uses
        (CPU seconds, memory now and at its peak, its memory limit, disk used)."""
        infos = await AsyncSandbox.list(config=self.state.config)
        return _json({"sandboxes": [{"sandbox_id": i.id, "image": i.image, "state": i.state,
                                     "expires_at": i.expires_at, "usage": agent_usage(i)} for i in infos]})

    @refusals_as_results
    async def delete_sandbox(self, ctx: Context, sandbox_id: str = "") -> CallToolResult:
        """Delete a sandbox (default: this session's) and everything in it."""
        if not sandbox_id and session_key(ctx) not in self.state.session_sandboxes:
            return _text("this session has no sandbox to delete")
        sbx = await self.state.sandbox(ctx, sandbox_id)
        try:
            if not self.state.release(sbx):
                await sbx.refresh()  # an id this server cannot reach is said so, not "deleted"
            await sbx.delete()
        finally:
            await sbx.close()
        return _json({"sandbox_id": sbx.id, "deleted": True})

    @refusals_as_results
    async def save_sandbox(self, ctx: Context, sandbox_id: str = "", label: str = "") -> CallToolResult:
        """Save a sandbox's variables by value (default: this session's), to continue later
        after it ends: returns save_id, what was saved and what could not be (open files,
        sockets, threads). create_sandbox(from_save=save_id) brings them back."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        saved = await sbx.saves.save(label or None)
        return _json({"save_id": saved["id"], "bytes": saved.get("bytes"), "summary": saved.get("summary")})

    @refusals_as_results
    async def run_code(self, ctx: Context, code: str, sandbox_id: str = "", timeout_seconds: float = 0) -> CallToolResult:
        """Run Python code in a sandbox (default: this session's). State persists between
        calls. Returns the printed text and the value of the last expression; figures come
        back as images; a failed run is marked as an error with its traceback."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        transcript = Transcript()
        execution = await sbx.run_code(code, timeout_seconds=timeout_seconds or None, on_event=transcript.add)
        exit_code, text, error = transcript.finish(execution)
        if execution.sandbox_state == V.DEAD:
            self.state.release(sbx)
        content: list[t.Any] = [TextContent(type="text", text=part) for part in (text, error) if part]
        content += [ImageContent(type="image", data=base64.b64encode(f.data).decode(), mime_type=f.mime_type)
                    for f in transcript.figures]
        return CallToolResult(content=content or [TextContent(type="text", text="(no output)")],
                              is_error=exit_code != 0)

    @refusals_as_results
    async def run_command(self, ctx: Context, command: str, sandbox_id: str = "", cwd: str = "",
                          timeout_seconds: float = 0) -> CallToolResult:
        """Run a shell command in a sandbox (default: this session's; same /workspace as
        run_code, no network). Returns exit_code, stdout, stderr and timed_out."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        result = await sbx.commands.run(command, cwd=cwd or None, timeout=timeout_seconds or None)
        body = {"exit_code": result.exit_code, "stdout": cap(result.stdout), "stderr": cap(result.stderr),
                "timed_out": result.timed_out}
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(body, indent=1))],
                              is_error=result.exit_code != 0 or bool(result.timed_out))

    @refusals_as_results
    async def write_file(self, ctx: Context, path: str, content: str, sandbox_id: str = "") -> CallToolResult:
        """Write a text file into a sandbox's /workspace (path relative to it)."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        body = await sbx.files.write(path, content.encode())
        return _json({"path": (body or {}).get("path", path), "size": len(content.encode())})

    @refusals_as_results
    async def read_file(self, ctx: Context, path: str, sandbox_id: str = "") -> CallToolResult:
        """Read a text file from a sandbox's /workspace (path relative to it)."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        try:
            data = await sbx.files.read(path, max_bytes=READ_MAX_BYTES)
        except InvalidRequest as exc:
            refusal = read_refusal(exc)
            if refusal is None:
                raise
            return _text(refusal, error=True)
        return _text(cap(data.decode("utf-8", "replace")))

    @refusals_as_results
    async def list_files(self, ctx: Context, sandbox_id: str = "") -> CallToolResult:
        """List the files in a sandbox's /workspace: path, size, type."""
        sbx = await self.state.sandbox(ctx, sandbox_id)
        files = await sbx.files.list()
        return _json({"files": [{"path": f.path, "size": f.size, "type": f.type} for f in files]})


TOOL_NAMES = ("create_sandbox", "list_sandboxes", "delete_sandbox", "run_code", "run_command", "write_file",
              "read_file", "list_files", "save_sandbox")


def build_server(state: SandboxMCP, *, with_commands: bool | None = None) -> MCPServer:
    """The MCPServer with its tools, over ``state``'s sandbox server (``run_command`` only
    when the client can run commands)."""
    server = MCPServer("sandbox-kernel", instructions=INSTRUCTIONS)
    tools = Tools(state)
    commands = has_commands() if with_commands is None else with_commands
    for name in TOOL_NAMES:
        if name != "run_command" or commands:
            server.add_tool(getattr(tools, name))
    return server


def has_commands() -> bool:
    """Whether this client can run commands (``sbx.commands``); the tool is offered only then."""
    return hasattr(AsyncSandbox("", config=ServerConfig(token_source="not used")), "commands")


async def serve_stdio(state: SandboxMCP) -> None:
    server = build_server(state)
    try:
        await server.run_stdio_async()
    finally:
        await state.close()


async def serve_http(state: SandboxMCP, host: str, port: int, *, log_level: str = "warning",
                     ready: t.Callable[[], None] | None = None) -> None:
    """Streamable HTTP at /mcp, behind the sandbox API's bearer token."""
    import uvicorn

    from ..service.api import TokenAuth

    if not state.config.token:
        raise SystemExit("error: the MCP server over HTTP needs a token to require of its clients (the sandbox "
                         "server's socket needs none): set SANDBOX_KERNEL_TOKEN or pass --token")
    server = build_server(state)
    app = TokenAuth(server.streamable_http_app(host=host), token=state.config.token)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await state.close()


def main(transport: str, host: str, port: int, url: str | None, token: str | None,
         image: str | None, ttl_seconds: int | None, scope: str | None = None, reach: t.Sequence[str] = ()) -> int:
    state = SandboxMCP(scoped(resolve(url, token), scope, reach), image=image, ttl_seconds=ttl_seconds or 1800)
    if transport == "stdio":
        asyncio.run(serve_stdio(state))
    else:
        asyncio.run(serve_http(state, host, port))
    return 0
