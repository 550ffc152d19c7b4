"""The client's calls, written once: `AsyncSandbox`, its files and commands, and the
module-level calls (`list_sandboxes`, `health`, `server_info`).

async_client.py is the source, because the kernel is async; sync_client.py is generated
from it by scripts/unasync.py (`async`/`await` dropped, `Async` prefixes and async httpx
names replaced). Edit async_client.py, then run the script. Docstrings here name no
flavour, so that they read right in both files.
"""

from __future__ import annotations

import dataclasses
import io
import os
import typing as t
from urllib.parse import quote

import httpx

from ..runtime import vocabulary as V
from .configuration import (
    DEFAULT_TIMEOUT,
    ServerConfig,
    as_timeout,
    create_timeout,
    execute_timeout,
    resolve,
    transfer_timeout,
)
from .event_http import AsyncEventConnections, lean_path
from .errors import SandboxError, SandboxGone, SandboxNotFound, error_from_response, transport_error
from .models import CommandResult, Execution, FileList, SandboxInfo, info_after
from .wire import (
    CHUNK_SIZE,
    Callback,
    FileData,
    Progress,
    Sink,
    acall,
    aiter_upload,
    EventRoute,
    check_size,
    check_stream_done,
    command_body,
    command_callbacks,
    content_length,
    drop_none,
    execute_callbacks,
    file_url,
    parse_line,
    total_size,
    upload_data,
)


class _AsyncTransport:
    """One httpx client plus the error mapping every call needs."""

    def __init__(self, config: ServerConfig, timeout: httpx.Timeout) -> None:
        self.config = config
        self.timeout = timeout
        self.client = httpx.AsyncClient(
            base_url=config.endpoint.base_url,
            headers=config.headers,
            timeout=timeout,
            transport=config.endpoint.async_transport(),
        )
        where = lean_path(config)
        self.events = AsyncEventConnections(config, where, timeout.connect) if where else None

    async def request(self, method: str, path: str, **kwargs: t.Any) -> t.Any:
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.config) from exc
        if response.is_error:
            raise error_from_response(response, self.config)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.content

    async def post_events(
        self, path: str, body: dict[str, t.Any], record: Execution | CommandResult, route: EventRoute, what: str
    ) -> None:
        """POST `body` and read the NDJSON event stream it answers: each event is folded
        into `record` and handed to the callbacks `route` picks. A stream that ends before
        its `done` raises ServerUnavailable, naming `what` ran ("the cell").

        A cell or command may print nothing for hours, so no read timeout: its own timeout
        is the server's business.
        """
        saw_done = False
        try:
            async with self.event_lines(path, body) as lines:
                async for line in lines:
                    event = parse_line(line)
                    if event is None or saw_done:
                        # Read the stream to its end even after `done`: a response left
                        # unread closes its connection, and the next call pays for a new one.
                        continue
                    record._apply(event)
                    for fn, arg in route(event):
                        await acall(fn, arg)
                    if event.get("type") == V.DONE:
                        saw_done = True
        except httpx.TransportError as exc:
            if not saw_done:
                raise transport_error(exc, self.config) from exc
        check_stream_done(saw_done, self.config, what)

    def event_lines(self, path: str, body: dict[str, t.Any]) -> t.AsyncContextManager[t.AsyncIterator[str]]:
        """The lines of the event stream `body` answers: on the kept connections of
        event_http.py where they can reach the server (most of a trivial cell's client CPU
        was httpx's), else through httpx."""
        if self.events is not None:
            return self.events.stream(path, body)
        return _AsyncLines(self.stream("POST", path, json=body, timeout=execute_timeout(self.timeout)))

    def stream(self, method: str, path: str, **kwargs: t.Any) -> t.AsyncContextManager[httpx.Response]:
        return _AsyncStream(self, method, path, kwargs)

    async def close(self) -> None:
        if self.events is not None:
            await self.events.aclose()
        await self.client.aclose()


class _AsyncStream:
    """`client.stream(...)` that raises our errors on entry, with the body read first."""

    def __init__(self, transport: _AsyncTransport, method: str, path: str, kwargs: dict[str, t.Any]) -> None:
        self.transport = transport
        self.cm = transport.client.stream(method, path, **kwargs)

    async def __aenter__(self) -> httpx.Response:
        try:
            response = await self.cm.__aenter__()
        except httpx.TransportError as exc:
            raise transport_error(exc, self.transport.config) from exc
        if response.is_error:
            try:
                await response.aread()
            except httpx.TransportError:
                pass
            finally:
                await self.cm.__aexit__(None, None, None)
            raise error_from_response(response, self.transport.config)
        return response

    async def __aexit__(self, *exc_info: t.Any) -> None:
        await self.cm.__aexit__(*exc_info)


class _AsyncLines:
    """An httpx stream as the lines of its body."""

    def __init__(self, stream: t.AsyncContextManager[httpx.Response]) -> None:
        self.cm = stream

    async def __aenter__(self) -> t.AsyncIterator[str]:
        return (await self.cm.__aenter__()).aiter_lines()

    async def __aexit__(self, *exc_info: t.Any) -> None:
        await self.cm.__aexit__(*exc_info)


class AsyncFiles:
    """The sandbox's `/workspace`, reachable from outside only through these calls."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def write(self, path: str, data: FileData, progress: Progress | None = None) -> dict[str, t.Any]:
        """Upload `data` to `path` (relative to /workspace), streamed in chunks.

        `data` may be bytes, a str (written as UTF-8 text), a `pathlib.Path` to a local
        file, a binary file object, or an iterable of byte chunks (in the async client, an
        async iterable too). `progress(sent, total)` is called as chunks go out (`total` is
        None when the size is unknown).
        """
        data = upload_data(data)
        total = total_size(data)
        headers = {"Content-Type": "application/octet-stream"}
        if total is not None:
            headers["Content-Length"] = str(total)
        tr = self._sandbox._transport
        return await tr.request(
            "PUT",
            file_url(self._sandbox.id, path),
            content=aiter_upload(data, progress, total),
            headers=headers,
            timeout=transfer_timeout(tr.timeout),
        )

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The whole file in memory: for small files (``max_bytes`` caps it, see `download`);
        use `download` for large ones."""
        buf = io.BytesIO()
        await self.download(path, buf, max_bytes=max_bytes)
        return buf.getvalue()

    async def download(self, path: str, dest: str | os.PathLike | t.BinaryIO, progress: Progress | None = None,
                       max_bytes: int | None = None) -> int:
        """Stream a file to `dest` (a local path or a binary file object); returns its size.

        A path is written to a temporary sibling and renamed at the end, so that a failed
        download never leaves a truncated file under the final name. With ``max_bytes``, a
        file larger than that (announced, or counted as it arrives) raises `InvalidRequest`
        (``too_large``) before more than ``max_bytes`` is written.
        """
        tr = self._sandbox._transport
        async with tr.stream("GET", file_url(self._sandbox.id, path), timeout=transfer_timeout(tr.timeout)) as response:
            total = content_length(response)
            check_size(path, total, max_bytes)
            with Sink(dest) as sink:
                received = 0
                if progress is not None:
                    progress(0, total)
                try:
                    async for chunk in response.aiter_bytes(CHUNK_SIZE):
                        received += len(chunk)
                        check_size(path, received, max_bytes)
                        sink.write(chunk)
                        if progress is not None:
                            progress(received, total)
                except httpx.TransportError as exc:
                    raise transport_error(exc, tr.config) from exc
        return received

    async def list(self) -> FileList:
        """Every file under /workspace, recursively (up to the server's cap: `.truncated`)."""
        body = await self._sandbox._transport.request("GET", self._sandbox._url("files"))
        return FileList.from_body(body)

    async def delete(self, path: str) -> None:
        await self._sandbox._transport.request("DELETE", file_url(self._sandbox.id, path))


class AsyncCommands:
    """Programs run in the sandbox beside its interpreter: same /workspace, limits and
    (lack of) network; they do not wait for a running cell."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: t.Union[str, t.Sequence[str]],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: t.Union[str, bytes, None] = None,
        timeout: float | None = None,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_start: Callback | None = None,
    ) -> CommandResult:
        """Run `cmd` and wait for its end; output is passed to the callbacks as it comes.

        `cmd` is an argv (list of str, run as given) or a str (run by `/bin/sh -c`); `cwd`
        is relative to /workspace; `env` is added to the sandbox's environment; `stdin` is
        text or bytes (none: /dev/null); `timeout` is in seconds (up to 24 h; default: the
        server's execute timeout). A non-zero exit is not raised: read `exit_code`.
        `on_start(command_id)` gets the id `interrupt` takes. Leaving early (Ctrl-C, an
        exception in a callback, a cancelled task) closes the stream, and the server stops
        the command.
        """
        result = CommandResult()
        await self._sandbox._transport.post_events(
            self._sandbox._url("commands"),
            command_body(cmd, cwd, env, stdin, timeout),
            result,
            lambda event: command_callbacks(event, on_stdout, on_stderr, on_start),
            "the command",
        )
        return result

    async def interrupt(self, command_id: str) -> bool:
        """SIGINT to a running command's process group (SIGKILL 2 s later if it is still
        running); False if no such command is running."""
        body = await self._sandbox._transport.request(
            "POST", self._sandbox._url(f"commands/{quote(command_id, safe='')}/interrupt")
        )
        return bool((body or {}).get("interrupted"))

    async def list(self) -> list[dict[str, t.Any]]:
        """The commands running now: command_id, argv or shell, cwd, timeout_seconds, started_at."""
        body = await self._sandbox._transport.request("GET", self._sandbox._url("commands"))
        return list((body or {}).get("commands", []))


class AsyncSaves:
    """A sandbox's variables by value (`sandbox.saves`): saved and loaded inside the sandbox, the
    bytes kept by the server, which never loads them. A new sandbox starts from a save with
    `create(from_save=ID)`; `list_saves` and `delete_save` need no sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def save(self, label: str | None = None) -> dict[str, t.Any]:
        """Save the variables; the answer has the save's `id` and a `summary` naming what was
        saved and what could not be (open files, sockets, threads, generators). A save past the
        server's caps raises SandboxError (code save_refused) and loses nothing."""
        sbx = self._sandbox
        return await sbx._transport.request("POST", sbx._url("save"), json=drop_none(label=label),
                                            timeout=transfer_timeout(sbx._transport.timeout))

    async def restore(self, save_id: str) -> dict[str, t.Any]:
        """Load a save into the sandbox's variables: what came back (`restored`), what did not
        (`lost`: name, type, why) and the save (`save`, with its `age_seconds`)."""
        sbx = self._sandbox
        return await sbx._transport.request("POST", sbx._url("restore"), json={"save_id": save_id},
                                            timeout=transfer_timeout(sbx._transport.timeout))


class AsyncSandbox:
    """A stateful Python sandbox on the server: variables survive from one `run_code` to the next
    until the sandbox is deleted, expires or dies.

    Used as a context manager it is deleted on exit, so that a crashed script does not leave it
    running until its TTL."""

    def __init__(
        self,
        id: str,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        info: SandboxInfo | None = None,
        config: ServerConfig | None = None,
        state_dir: str | os.PathLike | None = None,
    ) -> None:
        """Attach to sandbox `id` without asking the server: see `connect` for the checked way."""
        self.id = id
        self.config = config or resolve(url, token, state_dir)
        self._transport = _AsyncTransport(self.config, as_timeout(timeout))
        self._info = info
        self.files = AsyncFiles(self)
        self.commands = AsyncCommands(self)
        self.saves = AsyncSaves(self)

    # -- construction

    @classmethod
    async def create(
        cls,
        image: str | None = None,
        ttl_seconds: int | None = None,
        max_lifetime_seconds: int | None = None,
        memory_mb: int | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk_mb: int | None = None,
        *,
        metadata: dict[str, t.Any] | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        config: ServerConfig | None = None,
        state_dir: str | os.PathLike | None = None,
        end_with_caller: bool | None = None,
        egress: dict[str, t.Any] | None = None,
        isolation: str | None = None,
        on_idle: str | None = None,
        from_save: str | None = None,
    ) -> AsyncSandbox:
        """Claim a new sandbox; unset limits take the server's defaults.

        `end_with_caller`: the server ends the sandbox as soon as this process exits (the kernel's link; over
        a unix socket only). `egress`: the hosts it may reach through the server's egress proxy, e.g.
        ``{"allow": ["api.example.org"], "secrets": ["API_KEY"], "pip": True}`` (default: none).
        `isolation`: "bwrap" or "gvisor" (default: the server's); `on_idle`: "delete" or "pause" (gvisor:
        the idle TTL checkpoints it instead); `from_save`: a save to load, inside it (`info.restored`)."""
        config = config or resolve(url, token, state_dir)
        tout = as_timeout(timeout)
        sbx = cls("", timeout=tout, config=config)
        request = drop_none(image=image, ttl_seconds=ttl_seconds, max_lifetime_seconds=max_lifetime_seconds,
                            memory_mb=memory_mb, cpus=cpus, pids=pids, disk_mb=disk_mb, metadata=metadata,
                            end_with_caller=end_with_caller, egress=egress, isolation=isolation, on_idle=on_idle,
                            from_save=from_save)
        body = await _closing_on_failure(sbx, lambda: sbx._transport.request(
            "POST", "/v1/sandboxes", json=request, timeout=create_timeout(tout)))
        sbx._info = SandboxInfo.from_dict(body)
        sbx.id = sbx._info.id
        return sbx

    @classmethod
    async def connect(
        cls,
        id: str,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        config: ServerConfig | None = None,
        state_dir: str | os.PathLike | None = None,
    ) -> AsyncSandbox:
        """Attach to an existing sandbox; raises SandboxNotFound or SandboxGone if it is not alive."""
        sbx = cls(id, url=url, token=token, timeout=timeout, config=config, state_dir=state_dir)
        await _closing_on_failure(sbx, sbx.refresh)
        return sbx

    @classmethod
    async def list(
        cls,
        *,
        url: str | None = None,
        token: str | None = None,
        config: ServerConfig | None = None,
        state_dir: str | os.PathLike | None = None,
    ) -> list[SandboxInfo]:
        """The live sandboxes on the server (on a shared server: the caller's own)."""
        return await list_sandboxes(url=url, token=token, config=config, state_dir=state_dir)

    # -- state

    def _url(self, op: str = "") -> str:
        """The sandbox's route, or the route of one of its operations (`execute`, `pause`, ...)."""
        return f"/v1/sandboxes/{self.id}/{op}" if op else f"/v1/sandboxes/{self.id}"

    async def _call_for_info(self, method: str, op: str = "", **kwargs: t.Any) -> SandboxInfo:
        """Call a route that answers with the sandbox, and keep that answer as `info`."""
        self._info = SandboxInfo.from_dict(await self._transport.request(method, self._url(op), **kwargs))
        return self._info

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen: `create` and `connect` fill it, `run_code` and `renew`
        keep it current; a bare constructor has none until `refresh()` (a property cannot
        ask the server in the async client, so neither client does)."""
        if self._info is None:
            raise RuntimeError(f"no information on sandbox {self.id} yet: call refresh() first (or use connect())")
        return self._info

    async def refresh(self) -> SandboxInfo:
        """Ask the server for the sandbox as it is now."""
        return await self._call_for_info("GET")

    async def image(self) -> dict[str, t.Any]:
        """The image this sandbox runs, with ``package_list``: every package, its version,
        layer and source (GET /v1/images/{name})."""
        return await self._transport.request("GET", f"/v1/images/{(await self.refresh()).image}")

    async def is_running(self) -> bool:
        """True if the sandbox is alive on the server (asks the server)."""
        try:
            return (await self.refresh()).state == V.RUNNING
        except (SandboxGone, SandboxNotFound):
            return False

    # -- code

    async def run_code(
        self,
        code: str,
        *,
        timeout_seconds: float | None = None,
        silent: bool = False,
        store_history: bool = True,
        on_stdout: Callback | None = None,
        on_stderr: Callback | None = None,
        on_display: Callback | None = None,
        on_result: Callback | None = None,
        on_error: Callback | None = None,
        on_event: Callback | None = None,
        allow_stdin: bool = False,
        user_expressions: dict[str, str] | None = None,
        msg_id: str | None = None,
        stream_limit: int | None = None,
    ) -> Execution:
        """Run `code` and return what it produced; callbacks see each event as it arrives.

        An exception raised by the cell is not raised here: it is `Execution.error`, the way a notebook
        shows it. Leaving this call early (Ctrl-C, an exception in a callback, a cancelled task) closes
        the stream, and the server interrupts the cell.

        With `allow_stdin`, input() in the cell sends an `input_request` event (to `on_event`), answered
        with `answer_input`; `user_expressions` come back in `Execution.user_expressions`; `msg_id` is the
        cell's parent message id (ipywidgets' Output widget captures by it); `stream_limit` caps its
        stream text (docs/api.md).
        """
        execution = Execution()
        await self._transport.post_events(
            self._url("execute"),
            drop_none(code=code, timeout_seconds=timeout_seconds, silent=silent, store_history=store_history,
                      allow_stdin=allow_stdin or None, user_expressions=user_expressions or None,
                      msg_id=msg_id, stream_limit=stream_limit),
            execution,
            lambda event: execute_callbacks(event, on_stdout, on_stderr, on_display, on_result, on_error, on_event),
            "the cell",
        )
        self._info = info_after(self._info, execution)
        return execution

    async def pause(self) -> SandboxInfo:
        """Checkpoint a gvisor sandbox to disk and free its memory; the next call restores it."""
        return await self._call_for_info("POST", "pause")

    async def resume(self) -> SandboxInfo:
        """Restore a paused sandbox now (any other call would restore it too)."""
        return await self._call_for_info("POST", "resume")

    async def fork(
        self,
        *,
        ttl_seconds: int | None = None,
        max_lifetime_seconds: int | None = None,
        metadata: dict[str, t.Any] | None = None,
    ) -> AsyncSandbox:
        """A second, independent sandbox with this one's variables and a copy of its
        workspace (gvisor only: its checkpoint restored twice). This sandbox is paused for
        the checkpoint and restored as it was; the fork has its limits and, unless given
        here, its TTL and lifetime. Close or delete the fork on its own."""
        request = drop_none(ttl_seconds=ttl_seconds, max_lifetime_seconds=max_lifetime_seconds, metadata=metadata)
        body = await self._transport.request("POST", self._url("fork"), json=request,
                                             timeout=create_timeout(self._transport.timeout))
        info = SandboxInfo.from_dict(body)
        return type(self)(info.id, timeout=self._transport.timeout, info=info, config=self.config)

    async def send_comm(
        self,
        msg_type: str,
        comm_id: str,
        data: dict[str, t.Any] | None = None,
        *,
        metadata: dict[str, t.Any] | None = None,
        buffers: list[str] | None = None,
        target_name: str | None = None,
        msg_id: str | None = None,
        timeout_seconds: float | None = None,
        on_event: Callback | None = None,
    ) -> Execution:
        """Deliver a frontend's comm message (`comm_open`, `comm_msg`, `comm_close`) to the
        sandbox; it queues behind running cells, and the output and comm messages of its
        handlers arrive as events, as a cell's do. `buffers` are base64."""
        execution = Execution()
        await self._transport.post_events(
            self._url("comm"),
            drop_none(msg_type=msg_type, comm_id=comm_id, data=data, metadata=metadata, buffers=buffers,
                      target_name=target_name, msg_id=msg_id, timeout_seconds=timeout_seconds),
            execution,
            lambda event: execute_callbacks(event, None, None, None, None, None, on_event),
            "the comm message",
        )
        return execution

    async def answer_input(self, value: str) -> bool:
        """Answer the running cell's input(); False if no cell is waiting for input."""
        body = await self._transport.request("POST", self._url("input"), json={"value": value})
        return bool((body or {}).get("delivered"))

    async def interrupt(self) -> bool:
        """Send KeyboardInterrupt to the running cell; False if nothing was running."""
        body = await self._transport.request("POST", self._url("interrupt"))
        return bool((body or {}).get("interrupted"))

    async def renew(self, ttl_seconds: int | None = None, *, extend_seconds: int | None = None) -> SandboxInfo:
        """Restart the countdown at the sandbox's TTL, within the hard cap of its max lifetime.

        `ttl_seconds` changes the sliding TTL itself (every later execute renews to it);
        `extend_seconds` pushes expiry that far ahead once, leaving the TTL as it is.
        """
        return await self._call_for_info("POST", "renew",
                                         json=drop_none(ttl_seconds=ttl_seconds, extend_seconds=extend_seconds))

    async def delete(self) -> None:
        """Kill the sandbox and everything in it. Deleting one already gone is not an error:
        the caller's goal, that it no longer run, holds."""
        try:
            await self._transport.request("DELETE", self._url())
        except (SandboxGone, SandboxNotFound):
            pass
        if self._info is not None:
            self._info = dataclasses.replace(self._info, state=V.DELETED)

    # -- introspection

    async def complete(self, code: str, cursor_pos: int | None = None) -> dict[str, t.Any]:
        """Completions as in a Jupyter `complete_reply` (matches, cursor_start, cursor_end)."""
        pos = len(code) if cursor_pos is None else cursor_pos
        return await self._transport.request("POST", self._url("complete"), json={"code": code, "cursor_pos": pos})

    async def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> dict[str, t.Any]:
        """Help for the name at the cursor, as in a Jupyter `inspect_reply` (found, data)."""
        pos = len(code) if cursor_pos is None else cursor_pos
        return await self._transport.request("POST", self._url("inspect"),
                                             json={"code": code, "cursor_pos": pos, "detail_level": detail_level})

    async def is_complete(self, code: str) -> dict[str, t.Any]:
        """Whether `code` is a complete statement: status complete, incomplete or invalid."""
        return await self._transport.request("POST", self._url("is_complete"), json={"code": code})

    # -- lifetime of this object

    async def close(self) -> None:
        """Close the HTTP connections; the sandbox itself lives on (see `delete`)."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: t.Any) -> None:
        try:
            await self.delete()
        except SandboxError:
            # Do not hide the exception that ended the block behind a cleanup failure.
            if exc_info[0] is None:
                raise
        finally:
            await self.close()

    def __repr__(self) -> str:
        state = self._info.state if self._info else "?"
        return f"<AsyncSandbox {self.id} {state} at {self.config.url}>"


# -- module level


async def _closing_on_failure(sbx: AsyncSandbox, call: t.Callable[[], t.Any]) -> t.Any:
    """What ``call()`` answers; if it fails, the new sandbox object's connections are
    closed first (nobody holds the object to close them)."""
    try:
        return await call()
    except BaseException:
        await sbx.close()
        raise


async def list_sandboxes(
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> list[SandboxInfo]:
    """The live sandboxes on the server (on a shared server: the caller's own)."""
    tr = _AsyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        body = await tr.request("GET", "/v1/sandboxes")
    finally:
        await tr.close()
    return [SandboxInfo.from_dict(s) for s in body.get("sandboxes", [])]


async def list_saves(
    label: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> list[dict[str, t.Any]]:
    """Your saves (of `label` only, when given), newest first, each with its `age_seconds`."""
    tr = _AsyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        body = await tr.request("GET", "/v1/saves", params=drop_none(label=label))
    finally:
        await tr.close()
    return list(body.get("saves", []))


async def last_save_failure(
    label: str,
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> dict[str, t.Any] | None:
    """The last save the server could not make under `label` before a sandbox ended (`message`
    says why, `at` when), if none succeeded since; else None."""
    tr = _AsyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        body = await tr.request("GET", "/v1/saves", params={"label": label})
    finally:
        await tr.close()
    return body.get("last_failure")


async def delete_save(
    save_id: str,
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> None:
    """Delete one of your saves."""
    tr = _AsyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        await tr.request("DELETE", f"/v1/saves/{quote(save_id, safe='')}")
    finally:
        await tr.close()


async def health(
    *, url: str | None = None, timeout: float = 5.0, state_dir: str | os.PathLike | None = None
) -> dict[str, t.Any]:
    """`{"status": "ok", "version": ...}` if a server answers; ServerUnavailable if not.

    Needs no token, so it tells "no server" apart from "wrong token".
    """
    config = dataclasses.replace(resolve(url, None, state_dir), token=None, token_source="not needed")
    tr = _AsyncTransport(config, as_timeout(timeout))
    try:
        return await tr.request("GET", "/v1/health")
    finally:
        await tr.close()


async def server_info(
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> dict[str, t.Any]:
    """The server's version, the isolation in force and the warm pool's state."""
    tr = _AsyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        return await tr.request("GET", "/v1/info")
    finally:
        await tr.close()


async def hold(sandbox: AsyncSandbox) -> None:
    """`sandbox` is served by this process now (a notebook's kernel), which lets go of any
    other it held. Raises SandboxError with code ``in_use`` while another live process holds
    it: two kernels never share a sandbox. Over the unix socket only (InvalidRequest on TCP).
    A function, not a method: only kernels hold."""
    await sandbox._transport.request("POST", sandbox._url("hold"))
