"""Python client for the sandbox service.

The kernel uses it, and so can agents that have no use for Jupyter::

    from sandbox.client import Sandbox

    with Sandbox.create() as sbx:
        sbx.files.write("data.csv", pathlib.Path("local.csv"))
        execution = sbx.run_code("import pandas as pd; pd.read_csv('data.csv').shape")
        print(execution.text)

`Sandbox` and `AsyncSandbox` have the same surface; the async one awaits where the sync
one blocks, and its callbacks may be coroutine functions.

Every failure the server reports arrives as a `SandboxError` subclass carrying the
server's own message, because that message is what a user needs to read (why a sandbox is
gone, which field was wrong); a server that cannot be reached is a `ServerUnavailable`
whose message names the URL or socket it tried and says how to start one.

Which server: the one of the state directory (its unix socket), unless a URL is given; the
rule is sandbox/endpoint.py's, shared with the kernel and the command line.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import inspect
import io
import json
import os
import pathlib
import typing as t
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote

import httpx

from . import filenames
from .runtime import vocabulary as V
from . import endpoint as _endpoint
from .paths import default_state_dir as _default_state_dir

__all__ = [
    "AsyncCommands",
    "AsyncSandbox",
    "CommandResult",
    "Commands",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FileList",
    "InvalidRequest",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxInfo",
    "SandboxNotFound",
    "ServerConfig",
    "ServerUnavailable",
    "Unauthorized",
    "default_state_dir",
    "health",
    "list_sandboxes",
    "resolve",
    "server_info",
]

START_HINT = ("start it with `sandbox-kernel serve` (or open a notebook with the sandbox kernel, which "
              "starts it), or give --url / SANDBOX_KERNEL_URL, or --state-dir / SANDBOX_KERNEL_STATE_DIR")

# Most calls are quick bookkeeping on the server: a short read timeout turns a wedged
# server into an error instead of a hang. Connect is shorter still: on loopback a
# refused or silent port is known at once.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# Create may boot a sandbox when the warm pool is empty (a second or so) or build a
# custom image first (minutes).
CREATE_READ_TIMEOUT = 600.0
CHUNK_SIZE = 1024 * 1024

Callback = t.Callable[[t.Any], t.Any]
FileData = t.Union[bytes, bytearray, memoryview, str, pathlib.Path, t.BinaryIO, t.Iterable[bytes]]
Progress = t.Callable[[int, t.Optional[int]], t.Any]


# --------------------------------------------------------------------------- errors


class SandboxError(Exception):
    """An error the server reported, or that kept the request from reaching it.

    `code` is the server's machine-readable code (`not_found`, `gone`, ...), `message` its
    human-readable explanation, `status` the HTTP status (None when there was no response).
    """

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class SandboxNotFound(SandboxError):
    """404: the server does not know this sandbox (or this file in it)."""


class SandboxGone(SandboxError):
    """410: the sandbox existed but ended; the message says whether it expired, was
    deleted, died (and of what) or was lost."""


class Unauthorized(SandboxError):
    """401: missing or wrong bearer token."""


class InvalidRequest(SandboxError):
    """400, 413, 415 or 422: the server refused the request as given."""


class ServerUnavailable(SandboxError):
    """The server could not be reached, did not answer in time, or said 503.

    `sent` is False when the request certainly never reached the server (the connection
    was refused), so that retrying it cannot run anything twice.
    """

    def __init__(self, code: str, message: str, status: int | None = None, *, sent: bool = True) -> None:
        super().__init__(code, message, status)
        self.sent = sent


_STATUS_ERRORS: dict[int, type[SandboxError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: SandboxNotFound,
    410: SandboxGone,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    503: ServerUnavailable,
}


# --------------------------------------------------------------------------- config


def default_state_dir() -> pathlib.Path:
    """The server's state directory: the server's own rule (sandbox/paths.py)."""
    return pathlib.Path(_default_state_dir())


@dataclass(frozen=True)
class ServerConfig:
    """Where the server is and how to authenticate to it.

    `url` is what the user sees (``unix:/path/server.sock`` or ``http://host:port``);
    `socket` is set for a unix socket, where the server knows the caller by its uid and no
    token is needed. `token_source` records where the token came from (or where it was
    looked for), so that a 401 can tell the user what to fix.
    """

    url: str = ""
    token: str | None = field(default=None, repr=False)
    state_dir: pathlib.Path = field(default_factory=default_state_dir)
    token_source: str = ""
    socket: str | None = None

    @property
    def endpoint(self) -> _endpoint.Endpoint:
        return _endpoint.Endpoint(self.url, self.socket)

    @property
    def where(self) -> str:
        """The URL or socket, for messages."""
        return self.endpoint.describe()

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "sandbox-kernel-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


def resolve(
    url: str | None = None, token: str | None = None, state_dir: str | os.PathLike | None = None
) -> ServerConfig:
    """Find the server and the token: arguments, then the environment, then the state
    directory (sandbox/endpoint.py has the order).

    Over a unix socket no token is needed (the server checks the caller's uid); a token
    given explicitly is still sent. Over TCP the token file is read last because it only
    exists on the server's own machine. Raises `InvalidRequest` for a malformed URL.
    """
    try:
        where = _endpoint.find(url, state_dir)
    except _endpoint.EndpointError as exc:
        raise InvalidRequest("invalid_url", str(exc)) from None
    sdir = pathlib.Path(state_dir).expanduser().absolute() if state_dir else default_state_dir()
    if where.socket and os.path.dirname(where.socket) != str(sdir):
        sdir = pathlib.Path(os.path.dirname(where.socket))

    def config(tok: str | None, source: str) -> ServerConfig:
        return ServerConfig(where.url, tok, sdir, source, where.socket)

    if token:
        return config(token, "argument")
    env_token = os.environ.get("SANDBOX_KERNEL_TOKEN", "").strip()
    if env_token:
        return config(env_token, "SANDBOX_KERNEL_TOKEN")
    if where.socket:
        return config(None, "not needed: unix socket (the server checks the caller's uid)")
    token_file = sdir / "token"
    try:
        file_token = token_file.read_text().strip()
    except FileNotFoundError:
        return config(None, f"none: SANDBOX_KERNEL_TOKEN is unset and {token_file} does not exist")
    except OSError as exc:
        return config(None, f"none: SANDBOX_KERNEL_TOKEN is unset and {token_file} is unreadable ({exc.strerror})")
    return config(file_token or None, str(token_file))


# --------------------------------------------------------------------------- models


def _parse_time(value: t.Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Limits:
    """Resource limits in force for a sandbox (None where the server did not say)."""

    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_mb: int | None = None
    output_bytes: int | None = None
    file_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, t.Any] | None) -> Limits:
        data = data or {}
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class SandboxInfo:
    """The sandbox object as the server last described it.

    `isolation` stays a dict because its keys depend on the isolation backend; `raw` keeps
    the whole object so that fields newer than this client are not lost.
    """

    id: str
    state: str
    image: str | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    max_expires_at: datetime | None = None
    ttl_seconds: int | None = None
    execution_count: int = 0
    executing: bool = False
    limits: Limits = field(default_factory=Limits)
    isolation: dict[str, t.Any] = field(default_factory=dict)
    from_pool: bool | None = None
    dead_reason: str | None = None
    metadata: dict[str, t.Any] = field(default_factory=dict)
    raw: dict[str, t.Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, t.Any]) -> SandboxInfo:
        return cls(
            id=data["id"],
            state=data.get("state", "unknown"),
            image=data.get("image"),
            created_at=_parse_time(data.get("created_at")),
            expires_at=_parse_time(data.get("expires_at")),
            max_expires_at=_parse_time(data.get("max_expires_at")),
            ttl_seconds=data.get("ttl_seconds"),
            execution_count=data.get("execution_count") or 0,
            executing=bool(data.get("executing")),
            limits=Limits.from_dict(data.get("limits")),
            isolation=dict(data.get("isolation") or {}),
            from_pool=data.get("from_pool"),
            dead_reason=data.get("dead_reason"),
            metadata=dict(data.get("metadata") or {}),
            raw=dict(data),
        )

    def ttl_left(self, now: datetime | None = None) -> float | None:
        """Seconds until the sandbox expires if left idle (0 once past), or None if unknown.

        Computed from `expires_at` as last seen: run code or `refresh()` for a fresh figure.
        """
        if self.expires_at is None:
            return None
        now = now or datetime.now(timezone.utc)
        return max(0.0, (self.expires_at - now).total_seconds())


@dataclass(frozen=True)
class FileInfo:
    """One entry of a workspace listing. `path` is the escaped spelling the files calls
    take back (see sandbox/filenames.py); `raw_path` is the name's bytes."""

    path: str
    size: int | None = None
    type: str = "file"
    modified: datetime | None = None

    @property
    def raw_path(self) -> bytes:
        return filenames.unescape(self.path)

    @classmethod
    def from_dict(cls, data: dict[str, t.Any]) -> FileInfo:
        return cls(
            path=data["path"],
            size=data.get("size"),
            type=data.get("type", "file"),
            modified=_parse_time(data.get("modified")),
        )


class FileList(list):
    """A workspace listing: a list of FileInfo that also says whether the server cut it
    short (`truncated`, at `limit` entries)."""

    def __init__(self, files: t.Iterable[FileInfo] = (), truncated: bool = False, limit: int | None = None) -> None:
        super().__init__(files)
        self.truncated = truncated
        self.limit = limit

    @classmethod
    def from_body(cls, body: dict[str, t.Any]) -> FileList:
        return cls((FileInfo.from_dict(f) for f in body.get("files", [])), bool(body.get("truncated")), body.get("limit"))


@dataclass
class ExecutionError:
    """The exception a cell raised, as IPython formatted it."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}"


@dataclass
class Execution:
    """Everything one `run_code` call produced, gathered from the event stream.

    `results` holds the MIME bundles of `execute_result` events (the cell's value),
    `display` those of `display_data` and `update_display_data`. `status` is the server's
    `ok`, `error` or `aborted`; `reason` says why a cell did not end by itself
    (`interrupted`, `timeout_killed`, `oom`, ...); `sandbox_state` is `dead` when the
    sandbox did not survive the cell.
    """

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, t.Any]] = field(default_factory=list)
    display: list[dict[str, t.Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    status: str | None = None
    execution_count: int | None = None
    duration: float | None = None
    reason: str | None = None
    truncated: bool = False
    sandbox_state: str | None = None
    expires_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.status == V.OK and self.error is None

    @property
    def text(self) -> str | None:
        """The `text/plain` form of the cell's value, the way a REPL would echo it."""
        for bundle in reversed(self.results):
            if "text/plain" in bundle:
                return bundle["text/plain"]
        return None

    def _apply(self, event: dict[str, t.Any]) -> None:
        kind = event.get("type")
        if kind == V.STREAM:
            if event.get("name") == V.STDERR:
                self.stderr += event.get("text", "")
            else:
                self.stdout += event.get("text", "")
        elif kind == V.EXECUTE_RESULT:
            self.results.append(event.get("data") or {})
        elif kind in (V.DISPLAY_DATA, V.UPDATE_DISPLAY_DATA):
            self.display.append(event.get("data") or {})
        elif kind == V.ERROR:
            # The first error is the cell's: later ones (if any) are consequences.
            if self.error is None:
                self.error = ExecutionError(
                    event.get("ename", "Error"), event.get("evalue", ""), list(event.get("traceback") or [])
                )
        elif kind == V.DONE:
            self.status = event.get("status")
            self.execution_count = event.get("execution_count")
            self.duration = event.get("duration")
            self.reason = event.get("reason")
            self.truncated = bool(event.get("truncated"))
            self.sandbox_state = event.get("sandbox_state")
            self.expires_at = _parse_time(event.get("expires_at"))


@dataclass
class CommandResult:
    """What one `commands.run` call produced: the program's exit and its output.

    `exit_code` is the program's exit status, or None when it did not exit by itself: it
    was killed by a signal (`signal` says which; a timeout or an interrupt ends that way
    unless the program catches the signal) or the sandbox ended under it. `timed_out` is
    True when the command ran past its timeout; `reason` says why a command was stopped
    (`timeout`, `interrupted`, `client_disconnected`, `server_shutdown`, or the sandbox's
    end reason such as `deleted` or `oom`), and `message` explains in words. stdout and
    stderr are text (UTF-8, undecodable bytes replaced).
    """

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration: float = 0.0
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    truncated: bool = False
    command_id: str | None = None
    sandbox_state: str | None = None
    expires_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def _apply(self, event: dict[str, t.Any]) -> None:
        kind = event.get("type")
        if kind == V.START:
            self.command_id = event.get("command_id")
        elif kind == V.STREAM:
            if event.get("name") == V.STDERR:
                self.stderr += event.get("text", "")
            else:
                self.stdout += event.get("text", "")
        elif kind == V.DONE:
            self.exit_code = event.get("exit_code")
            self.signal = event.get("signal")
            self.timed_out = bool(event.get("timed_out"))
            self.duration = float(event.get("duration") or 0.0)
            self.reason = event.get("reason")
            self.message = event.get("message")
            self.truncated = bool(event.get("truncated"))
            self.sandbox_state = event.get("sandbox_state")
            self.expires_at = _parse_time(event.get("expires_at"))


def _command_body(
    cmd: t.Union[str, t.Sequence[str]],
    cwd: str | None,
    env: dict[str, str] | None,
    stdin: t.Union[str, bytes, None],
    timeout: float | None,
) -> dict[str, t.Any]:
    """The request body: a str is a shell command line, a sequence of str is an argv."""
    if isinstance(cmd, str):
        body: dict[str, t.Any] = {"shell": cmd}
    elif isinstance(cmd, (list, tuple)) and all(isinstance(a, str) for a in cmd):
        body = {"argv": list(cmd)}
    else:
        raise TypeError("cmd must be a str (run by /bin/sh -c) or a list of str (an argv)")
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    elif stdin is not None:
        body["stdin"] = stdin
    return {**body, **_create_body(cwd=cwd, env=env, timeout_seconds=timeout)}


def _command_callbacks(
    event: dict[str, t.Any], on_stdout: Callback | None, on_stderr: Callback | None, on_start: Callback | None
) -> list[tuple[Callback, t.Any]]:
    kind = event.get("type")
    if kind == V.STREAM:
        target = on_stderr if event.get("name") == V.STDERR else on_stdout
        return [(target, event.get("text", ""))] if target else []
    if kind == V.START and on_start:
        return [(on_start, event.get("command_id"))]
    return []


def _check_command_done(saw_done: bool, config: ServerConfig) -> None:
    if not saw_done:
        raise ServerUnavailable(
            "stream_ended",
            f"the sandbox server at {config.url} ended the command's stream before the command finished "
            "(server restarted or connection lost); the command may have partly run",
        )


def _callbacks_for(
    event: dict[str, t.Any],
    on_stdout: Callback | None,
    on_stderr: Callback | None,
    on_display: Callback | None,
    on_result: Callback | None,
    on_error: Callback | None,
    on_event: Callback | None,
) -> list[tuple[Callback, t.Any]]:
    calls: list[tuple[Callback, t.Any]] = []
    kind = event.get("type")
    if kind == V.STREAM:
        target = on_stderr if event.get("name") == V.STDERR else on_stdout
        if target:
            calls.append((target, event.get("text", "")))
    elif kind in (V.DISPLAY_DATA, V.UPDATE_DISPLAY_DATA, V.CLEAR_OUTPUT):
        if on_display:
            calls.append((on_display, event))
    elif kind == V.EXECUTE_RESULT:
        if on_result:
            calls.append((on_result, event))
    elif kind == V.ERROR:
        if on_error:
            calls.append((on_error, event))
    if on_event:
        calls.append((on_event, event))
    return calls


# --------------------------------------------------------------------------- plumbing


def _error_from_response(response: httpx.Response, config: ServerConfig) -> SandboxError:
    """Turn a non-2xx response into the matching exception, keeping the server's words."""
    code, message = "error", ""
    try:
        body = response.json()
        err = body.get("error", {}) if isinstance(body, dict) else {}
        code = err.get("code") or code
        message = err.get("message") or ""
    except (ValueError, UnicodeDecodeError):
        message = response.text.strip()[:500]
    if not message:
        message = f"HTTP {response.status_code} {response.reason_phrase}"
    status = response.status_code
    cls = _STATUS_ERRORS.get(status)
    if cls is None:
        cls = ServerUnavailable if status >= 500 else SandboxError
    if cls is Unauthorized:
        message = f"the sandbox server at {config.where} refused the request: {message} (token: {config.token_source or 'none'})"
    if cls is ServerUnavailable:
        return ServerUnavailable(code, f"sandbox server at {config.where}: {message}", status, sent=True)
    return cls(code, message, status)


def _transport_error(exc: httpx.TransportError, config: ServerConfig) -> ServerUnavailable:
    if isinstance(exc, httpx.ConnectError):
        return ServerUnavailable(
            "unreachable",
            f"cannot reach the sandbox server at {config.where} ({exc or 'connection refused'}): {START_HINT}",
            sent=False,
        )
    if isinstance(exc, httpx.ConnectTimeout):
        return ServerUnavailable(
            "unreachable", f"connecting to the sandbox server at {config.where} timed out: {START_HINT}", sent=False
        )
    if isinstance(exc, httpx.TimeoutException):
        return ServerUnavailable(
            "timeout", f"the sandbox server at {config.where} did not answer in time ({type(exc).__name__})"
        )
    return ServerUnavailable(
        "unreachable", f"lost the connection to the sandbox server at {config.where} ({type(exc).__name__}: {exc})"
    )


def _file_url(sandbox_id: str, path: str) -> str:
    """The URL path of a file, confined to /workspace by the server, not by us.

    `/workspace/x` is accepted as a spelling of `x`. Dot segments are percent-encoded
    because httpx would otherwise resolve `a/../b` to `b` before sending, silently
    writing somewhere other than asked; encoded, they reach the server, which refuses them.
    """
    path = os.fspath(path)
    if path == "/workspace":
        path = ""
    elif path.startswith("/workspace/"):
        path = path[len("/workspace/") :]
    segments = []
    for seg in path.split("/"):
        if seg in (".", ".."):
            segments.append(seg.replace(".", "%2E"))
        else:
            segments.append(quote(seg, safe=""))
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}/files/" + "/".join(segments)


def _total_size(data: t.Any) -> int | None:
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    if isinstance(data, memoryview):
        return data.nbytes
    if isinstance(data, pathlib.Path):
        return data.stat().st_size
    if hasattr(data, "read"):
        try:
            return os.fstat(data.fileno()).st_size - data.tell()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            pass
        try:
            pos = data.tell()
            end = data.seek(0, io.SEEK_END)
            data.seek(pos)
            return end - pos
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return None
    return None


def _as_bytes(chunk: t.Any) -> bytes:
    if isinstance(chunk, str):
        return chunk.encode()
    return bytes(chunk)


def _iter_upload(data: t.Any, progress: Progress | None, total: int | None) -> t.Iterator[bytes]:
    """Yield the upload in chunks so that a large file is never held whole in memory."""
    sent = 0

    def tick(n: int) -> None:
        nonlocal sent
        sent += n
        if progress is not None:
            progress(sent, total)

    if progress is not None:
        progress(0, total)
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK_SIZE):
            chunk = bytes(view[start : start + CHUNK_SIZE])
            yield chunk
            tick(len(chunk))
        return
    if isinstance(data, pathlib.Path):
        with data.open("rb") as f:
            while chunk := f.read(CHUNK_SIZE):
                yield chunk
                tick(len(chunk))
        return
    if hasattr(data, "read"):
        while chunk := data.read(CHUNK_SIZE):
            chunk = _as_bytes(chunk)
            yield chunk
            tick(len(chunk))
        return
    for chunk in data:
        chunk = _as_bytes(chunk)
        if chunk:
            yield chunk
            tick(len(chunk))


async def _aiter_upload(data: t.Any, progress: Progress | None, total: int | None) -> t.AsyncIterator[bytes]:
    """Async twin of `_iter_upload`: disk reads run in a thread to keep the loop free."""
    if isinstance(data, t.AsyncIterable):
        sent = 0
        if progress is not None:
            progress(0, total)
        async for chunk in data:
            chunk = _as_bytes(chunk)
            if chunk:
                yield chunk
                sent += len(chunk)
                if progress is not None:
                    progress(sent, total)
        return
    if isinstance(data, (bytes, bytearray, memoryview)):
        for chunk in _iter_upload(data, progress, total):
            yield chunk
        return
    iterator = _iter_upload(data, progress, total)
    sentinel = object()
    while True:
        chunk = await asyncio.to_thread(next, iterator, sentinel)
        if chunk is sentinel:
            return
        yield t.cast(bytes, chunk)


def _upload_data(data: t.Any) -> t.Any:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, os.PathLike) and not isinstance(data, pathlib.Path):
        return pathlib.Path(data)
    return data


def _check_execute_done(execution: Execution, saw_done: bool, config: ServerConfig) -> None:
    if not saw_done:
        raise ServerUnavailable(
            "stream_ended",
            f"the sandbox server at {config.url} ended the execute stream before the cell finished "
            "(server restarted or connection lost); the cell may have partly run",
        )


def _info_after(info: SandboxInfo | None, execution: Execution) -> SandboxInfo | None:
    """Fold what a `done` event says about the sandbox into its last-seen info, so that
    `info.ttl_left()` stays right without another request."""
    if info is None:
        return None
    changes: dict[str, t.Any] = {}
    if execution.expires_at is not None:
        changes["expires_at"] = execution.expires_at
    if execution.execution_count is not None:
        changes["execution_count"] = execution.execution_count
    if execution.sandbox_state:
        changes["state"] = execution.sandbox_state
    return dataclasses.replace(info, **changes) if changes else info


def _parse_line(line: str) -> dict[str, t.Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _create_body(**fields: t.Any) -> dict[str, t.Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _execute_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # A cell may print nothing for hours; its own timeout is the server's business.
    return httpx.Timeout(connect=timeout.connect, read=None, write=timeout.write, pool=timeout.pool)


def _transfer_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # The server may pause while writing a large file to disk.
    read = None if timeout.read is None else max(timeout.read, 120.0)
    return httpx.Timeout(connect=timeout.connect, read=read, write=None, pool=timeout.pool)


def _as_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    if timeout is None:
        return DEFAULT_TIMEOUT
    return httpx.Timeout(timeout, connect=min(5.0, timeout))


def _create_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    read = None if timeout.read is None else max(timeout.read, CREATE_READ_TIMEOUT)
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


# --------------------------------------------------------------------------- sync


class _SyncTransport:
    """One httpx.Client plus the error mapping every call needs."""

    def __init__(self, config: ServerConfig, timeout: httpx.Timeout) -> None:
        self.config = config
        self.timeout = timeout
        self.client = httpx.Client(base_url=config.endpoint.base_url, headers=config.headers, timeout=timeout,
                                   transport=config.endpoint.transport())

    def request(self, method: str, path: str, **kwargs: t.Any) -> t.Any:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.config) from exc
        if response.is_error:
            raise _error_from_response(response, self.config)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.content

    def stream(self, method: str, path: str, **kwargs: t.Any) -> t.ContextManager[httpx.Response]:
        return _SyncStream(self, method, path, kwargs)

    def close(self) -> None:
        self.client.close()


class _SyncStream:
    """`client.stream(...)` that raises our errors on entry, with the body read first."""

    def __init__(self, transport: _SyncTransport, method: str, path: str, kwargs: dict[str, t.Any]) -> None:
        self.transport = transport
        self.cm = transport.client.stream(method, path, **kwargs)

    def __enter__(self) -> httpx.Response:
        try:
            response = self.cm.__enter__()
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.transport.config) from exc
        if response.is_error:
            try:
                response.read()
            except httpx.TransportError:
                pass
            finally:
                self.cm.__exit__(None, None, None)
            raise _error_from_response(response, self.transport.config)
        return response

    def __exit__(self, *exc_info: t.Any) -> None:
        self.cm.__exit__(*exc_info)


class Files:
    """The sandbox's `/workspace`, reachable from outside only through these calls."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def write(self, path: str, data: FileData, progress: Progress | None = None) -> dict[str, t.Any]:
        """Upload `data` to `path` (relative to /workspace), streamed in chunks.

        `data` may be bytes, a str (written as UTF-8 text), a `pathlib.Path` to a local
        file, a binary file object, or an iterable of byte chunks. `progress(sent, total)`
        is called as chunks go out (`total` is None when the size is unknown).
        """
        data = _upload_data(data)
        total = _total_size(data)
        headers = {"Content-Type": "application/octet-stream"}
        if total is not None:
            headers["Content-Length"] = str(total)
        tr = self._sandbox._transport
        return tr.request(
            "PUT",
            _file_url(self._sandbox.id, path),
            content=_iter_upload(data, progress, total),
            headers=headers,
            timeout=_transfer_timeout(tr.timeout),
        )

    def read(self, path: str) -> bytes:
        """The whole file in memory: for small files; use `download` for large ones."""
        buf = io.BytesIO()
        self.download(path, buf)
        return buf.getvalue()

    def download(self, path: str, dest: str | os.PathLike | t.BinaryIO, progress: Progress | None = None) -> int:
        """Stream a file to `dest` (a local path or a binary file object); returns its size.

        A path is written to a temporary sibling and renamed at the end, so that a failed
        download never leaves a truncated file under the final name.
        """
        tr = self._sandbox._transport
        with tr.stream("GET", _file_url(self._sandbox.id, path), timeout=_transfer_timeout(tr.timeout)) as response:
            total = _content_length(response)
            with _Sink(dest) as sink:
                received = 0
                if progress is not None:
                    progress(0, total)
                try:
                    for chunk in response.iter_bytes(CHUNK_SIZE):
                        sink.write(chunk)
                        received += len(chunk)
                        if progress is not None:
                            progress(received, total)
                except httpx.TransportError as exc:
                    raise _transport_error(exc, tr.config) from exc
        return received

    def list(self) -> FileList:
        """Every file under /workspace, recursively (up to the server's cap: `.truncated`)."""
        body = self._sandbox._transport.request("GET", f"/v1/sandboxes/{self._sandbox.id}/files")
        return FileList.from_body(body)

    def delete(self, path: str) -> None:
        self._sandbox._transport.request("DELETE", _file_url(self._sandbox.id, path))


def _content_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["Content-Length"])
    except (KeyError, ValueError):
        return None


class Commands:
    """Programs run in the sandbox beside its interpreter: same /workspace, limits and
    (lack of) network; they do not wait for a running cell."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def run(
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
        exception in a callback) closes the stream, and the server stops the command.
        """
        body = _command_body(cmd, cwd, env, stdin, timeout)
        result = CommandResult()
        saw_done = False
        tr = self._sandbox._transport
        with tr.stream(
            "POST", f"/v1/sandboxes/{self._sandbox.id}/commands", json=body, timeout=_execute_timeout(tr.timeout)
        ) as response:
            try:
                for line in response.iter_lines():
                    event = _parse_line(line)
                    if event is None or saw_done:
                        continue
                    result._apply(event)
                    for fn, arg in _command_callbacks(event, on_stdout, on_stderr, on_start):
                        fn(arg)
                    if event.get("type") == V.DONE:
                        saw_done = True
            except httpx.TransportError as exc:
                if not saw_done:
                    raise _transport_error(exc, tr.config) from exc
        _check_command_done(saw_done, tr.config)
        return result

    def interrupt(self, command_id: str) -> bool:
        """SIGINT to a running command's process group (SIGKILL 2 s later if it is still
        running); False if no such command is running."""
        body = self._sandbox._transport.request(
            "POST", f"/v1/sandboxes/{self._sandbox.id}/commands/{quote(command_id, safe='')}/interrupt"
        )
        return bool((body or {}).get("interrupted"))

    def list(self) -> list[dict[str, t.Any]]:
        """The commands running now: command_id, argv or shell, cwd, timeout_seconds, started_at."""
        body = self._sandbox._transport.request("GET", f"/v1/sandboxes/{self._sandbox.id}/commands")
        return list((body or {}).get("commands", []))


class _Sink:
    def __init__(self, dest: str | os.PathLike | t.BinaryIO) -> None:
        self.dest = dest
        self.file: t.BinaryIO | None = None
        self.tmp: pathlib.Path | None = None

    def __enter__(self) -> t.BinaryIO:
        if hasattr(self.dest, "write"):
            return t.cast(t.BinaryIO, self.dest)
        final = pathlib.Path(t.cast(os.PathLike, self.dest))
        self.tmp = final.with_name(f".{final.name}.{os.getpid()}.part")
        self.file = self.tmp.open("wb")
        return self.file

    def __exit__(self, exc_type: t.Any, *rest: t.Any) -> None:
        if self.file is None or self.tmp is None:
            return
        self.file.close()
        if exc_type is None:
            os.replace(self.tmp, pathlib.Path(t.cast(os.PathLike, self.dest)))
        else:
            self.tmp.unlink(missing_ok=True)


class Sandbox:
    """A stateful Python sandbox on the server: variables survive from one `run_code` to
    the next until the sandbox is deleted, expires or dies.

    Used as a context manager it is deleted on exit, so that a crashed script does not
    leave it running until its TTL.
    """

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
        self._transport = _SyncTransport(self.config, _as_timeout(timeout))
        self._info = info
        self.files = Files(self)
        self.commands = Commands(self)

    # -- construction

    @classmethod
    def create(
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
        state_dir: str | os.PathLike | None = None,
        config: ServerConfig | None = None,
        end_with_caller: bool | None = None,
    ) -> Sandbox:
        """Claim a new sandbox; unset limits take the server's defaults.

        `end_with_caller`: the server ends the sandbox as soon as this process exits (the
        kernel's link; over a unix socket only, where the server knows the caller's pid).
        """
        config = config or resolve(url, token, state_dir)
        tout = _as_timeout(timeout)
        transport = _SyncTransport(config, tout)
        try:
            body = transport.request(
                "POST",
                "/v1/sandboxes",
                json=_create_body(
                    image=image,
                    ttl_seconds=ttl_seconds,
                    max_lifetime_seconds=max_lifetime_seconds,
                    memory_mb=memory_mb,
                    cpus=cpus,
                    pids=pids,
                    disk_mb=disk_mb,
                    metadata=metadata,
                    end_with_caller=end_with_caller,
                ),
                timeout=_create_timeout(tout),
            )
        finally:
            transport.close()
        info = SandboxInfo.from_dict(body)
        return cls(info.id, timeout=tout, info=info, config=config)

    @classmethod
    def connect(
        cls,
        id: str,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        state_dir: str | os.PathLike | None = None,
        config: ServerConfig | None = None,
    ) -> Sandbox:
        """Attach to an existing sandbox; raises SandboxNotFound or SandboxGone if it is not alive."""
        sbx = cls(id, url=url, token=token, timeout=timeout, state_dir=state_dir, config=config)
        try:
            sbx.refresh()
        except BaseException:
            sbx.close()
            raise
        return sbx

    @classmethod
    def list(
        cls,
        *,
        url: str | None = None,
        token: str | None = None,
        state_dir: str | os.PathLike | None = None,
        config: ServerConfig | None = None,
    ) -> list[SandboxInfo]:
        return list_sandboxes(url=url, token=token, state_dir=state_dir, config=config)

    # -- state

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen (fetched on first access)."""
        if self._info is None:
            self.refresh()
        return t.cast(SandboxInfo, self._info)

    def refresh(self) -> SandboxInfo:
        self._info = SandboxInfo.from_dict(self._transport.request("GET", f"/v1/sandboxes/{self.id}"))
        return self._info

    def is_running(self) -> bool:
        """True if the sandbox is alive on the server (asks the server)."""
        try:
            return self.refresh().state == V.RUNNING
        except (SandboxGone, SandboxNotFound):
            return False

    # -- code

    def run_code(
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
    ) -> Execution:
        """Run `code` and return what it produced; callbacks see each event as it arrives.

        An exception raised by the cell is not raised here: it is `Execution.error`, the way
        a notebook shows it. Leaving this call early (Ctrl-C, an exception in a callback)
        closes the stream, and the server interrupts the cell.
        """
        body = _create_body(code=code, timeout_seconds=timeout_seconds, silent=silent, store_history=store_history)
        execution = Execution()
        saw_done = False
        tr = self._transport
        with tr.stream(
            "POST", f"/v1/sandboxes/{self.id}/execute", json=body, timeout=_execute_timeout(tr.timeout)
        ) as response:
            try:
                for line in response.iter_lines():
                    event = _parse_line(line)
                    if event is None or saw_done:
                        # Read the stream to its end even after `done`: a response left
                        # unread closes its connection, and the next cell pays for a new one.
                        continue
                    execution._apply(event)
                    for fn, arg in _callbacks_for(
                        event, on_stdout, on_stderr, on_display, on_result, on_error, on_event
                    ):
                        fn(arg)
                    if event.get("type") == V.DONE:
                        saw_done = True
            except httpx.TransportError as exc:
                if not saw_done:
                    raise _transport_error(exc, tr.config) from exc
        _check_execute_done(execution, saw_done, tr.config)
        self._info = _info_after(self._info, execution)
        return execution

    def interrupt(self) -> bool:
        """Send KeyboardInterrupt to the running cell; False if nothing was running."""
        body = self._transport.request("POST", f"/v1/sandboxes/{self.id}/interrupt")
        return bool((body or {}).get("interrupted"))

    def renew(self, ttl_seconds: int | None = None, *, extend_seconds: int | None = None) -> SandboxInfo:
        """Restart the countdown at the sandbox's TTL, within the hard cap of its max lifetime.

        `ttl_seconds` changes the sliding TTL itself (every later execute renews to it);
        `extend_seconds` pushes expiry that far ahead once, leaving the TTL as it is.
        """
        body = _create_body(ttl_seconds=ttl_seconds, extend_seconds=extend_seconds)
        self._info = SandboxInfo.from_dict(self._transport.request("POST", f"/v1/sandboxes/{self.id}/renew", json=body))
        return self._info

    def delete(self) -> None:
        """Kill the sandbox and everything in it. Deleting one already gone is not an error:
        the caller's goal, that it no longer run, holds."""
        try:
            self._transport.request("DELETE", f"/v1/sandboxes/{self.id}")
        except (SandboxGone, SandboxNotFound):
            pass
        if self._info is not None:
            self._info = dataclasses.replace(self._info, state=V.DELETED)

    # -- introspection

    def complete(self, code: str, cursor_pos: int | None = None) -> dict[str, t.Any]:
        """Completions as in a Jupyter `complete_reply` (matches, cursor_start, cursor_end)."""
        pos = len(code) if cursor_pos is None else cursor_pos
        return self._transport.request(
            "POST", f"/v1/sandboxes/{self.id}/complete", json={"code": code, "cursor_pos": pos}
        )

    def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> dict[str, t.Any]:
        """Help for the name at the cursor, as in a Jupyter `inspect_reply` (found, data)."""
        pos = len(code) if cursor_pos is None else cursor_pos
        return self._transport.request(
            "POST",
            f"/v1/sandboxes/{self.id}/inspect",
            json={"code": code, "cursor_pos": pos, "detail_level": detail_level},
        )

    def is_complete(self, code: str) -> dict[str, t.Any]:
        """Whether `code` is a complete statement: status complete, incomplete or invalid."""
        return self._transport.request("POST", f"/v1/sandboxes/{self.id}/is_complete", json={"code": code})

    # -- lifetime of this object

    def close(self) -> None:
        """Close the HTTP connections; the sandbox itself lives on (see `delete`)."""
        self._transport.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        try:
            self.delete()
        except SandboxError:
            # Do not hide the exception that ended the block behind a cleanup failure.
            if exc_info[0] is None:
                raise
        finally:
            self.close()

    def __repr__(self) -> str:
        state = self._info.state if self._info else "?"
        return f"<Sandbox {self.id} {state} at {self.config.url}>"


# --------------------------------------------------------------------------- async


class _AsyncTransport:
    def __init__(self, config: ServerConfig, timeout: httpx.Timeout) -> None:
        self.config = config
        self.timeout = timeout
        self.client = httpx.AsyncClient(base_url=config.endpoint.base_url, headers=config.headers, timeout=timeout,
                                        transport=config.endpoint.async_transport())

    async def request(self, method: str, path: str, **kwargs: t.Any) -> t.Any:
        try:
            response = await self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.config) from exc
        if response.is_error:
            raise _error_from_response(response, self.config)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.content

    def stream(self, method: str, path: str, **kwargs: t.Any) -> t.AsyncContextManager[httpx.Response]:
        return _AsyncStream(self, method, path, kwargs)

    async def close(self) -> None:
        await self.client.aclose()


class _AsyncStream:
    def __init__(self, transport: _AsyncTransport, method: str, path: str, kwargs: dict[str, t.Any]) -> None:
        self.transport = transport
        self.cm = transport.client.stream(method, path, **kwargs)

    async def __aenter__(self) -> httpx.Response:
        try:
            response = await self.cm.__aenter__()
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.transport.config) from exc
        if response.is_error:
            try:
                await response.aread()
            except httpx.TransportError:
                pass
            finally:
                await self.cm.__aexit__(None, None, None)
            raise _error_from_response(response, self.transport.config)
        return response

    async def __aexit__(self, *exc_info: t.Any) -> None:
        await self.cm.__aexit__(*exc_info)


async def _call(fn: Callback, arg: t.Any) -> None:
    result = fn(arg)
    if inspect.isawaitable(result):
        await result


class AsyncFiles:
    """Async twin of `Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def write(
        self, path: str, data: FileData | t.AsyncIterable[bytes], progress: Progress | None = None
    ) -> dict[str, t.Any]:
        """See `Files.write`; an async iterable of chunks is accepted too."""
        data = _upload_data(data)
        total = _total_size(data)
        headers = {"Content-Type": "application/octet-stream"}
        if total is not None:
            headers["Content-Length"] = str(total)
        tr = self._sandbox._transport
        return await tr.request(
            "PUT",
            _file_url(self._sandbox.id, path),
            content=_aiter_upload(data, progress, total),
            headers=headers,
            timeout=_transfer_timeout(tr.timeout),
        )

    async def read(self, path: str) -> bytes:
        buf = io.BytesIO()
        await self.download(path, buf)
        return buf.getvalue()

    async def download(self, path: str, dest: str | os.PathLike | t.BinaryIO, progress: Progress | None = None) -> int:
        """See `Files.download`."""
        tr = self._sandbox._transport
        async with tr.stream(
            "GET", _file_url(self._sandbox.id, path), timeout=_transfer_timeout(tr.timeout)
        ) as response:
            total = _content_length(response)
            with _Sink(dest) as sink:
                received = 0
                if progress is not None:
                    progress(0, total)
                try:
                    async for chunk in response.aiter_bytes(CHUNK_SIZE):
                        sink.write(chunk)
                        received += len(chunk)
                        if progress is not None:
                            progress(received, total)
                except httpx.TransportError as exc:
                    raise _transport_error(exc, tr.config) from exc
        return received

    async def list(self) -> FileList:
        body = await self._sandbox._transport.request("GET", f"/v1/sandboxes/{self._sandbox.id}/files")
        return FileList.from_body(body)

    async def delete(self, path: str) -> None:
        await self._sandbox._transport.request("DELETE", _file_url(self._sandbox.id, path))


class AsyncCommands:
    """Async twin of `Commands`; callbacks may be coroutine functions."""

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
        """See `Commands.run`. Cancelling the task closes the stream and so stops the command."""
        body = _command_body(cmd, cwd, env, stdin, timeout)
        result = CommandResult()
        saw_done = False
        tr = self._sandbox._transport
        async with tr.stream(
            "POST", f"/v1/sandboxes/{self._sandbox.id}/commands", json=body, timeout=_execute_timeout(tr.timeout)
        ) as response:
            try:
                async for line in response.aiter_lines():
                    event = _parse_line(line)
                    if event is None or saw_done:
                        continue
                    result._apply(event)
                    for fn, arg in _command_callbacks(event, on_stdout, on_stderr, on_start):
                        await _call(fn, arg)
                    if event.get("type") == V.DONE:
                        saw_done = True
            except httpx.TransportError as exc:
                if not saw_done:
                    raise _transport_error(exc, tr.config) from exc
        _check_command_done(saw_done, tr.config)
        return result

    async def interrupt(self, command_id: str) -> bool:
        body = await self._sandbox._transport.request(
            "POST", f"/v1/sandboxes/{self._sandbox.id}/commands/{quote(command_id, safe='')}/interrupt"
        )
        return bool((body or {}).get("interrupted"))

    async def list(self) -> list[dict[str, t.Any]]:
        body = await self._sandbox._transport.request("GET", f"/v1/sandboxes/{self._sandbox.id}/commands")
        return list((body or {}).get("commands", []))


class AsyncSandbox:
    """Async twin of `Sandbox`: same methods, awaited; callbacks may be coroutine functions.

    An instance belongs to the event loop it is first used on (httpx's connection pool
    does): another thread with its own loop should attach its own instance.
    """

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
        self.id = id
        self.config = config or resolve(url, token, state_dir)
        self._transport = _AsyncTransport(self.config, _as_timeout(timeout))
        self._info = info
        self.files = AsyncFiles(self)
        self.commands = AsyncCommands(self)

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
    ) -> AsyncSandbox:
        config = config or resolve(url, token, state_dir)
        tout = _as_timeout(timeout)
        sbx = cls("", timeout=tout, config=config)
        try:
            body = await sbx._transport.request(
                "POST",
                "/v1/sandboxes",
                json=_create_body(
                    image=image,
                    ttl_seconds=ttl_seconds,
                    max_lifetime_seconds=max_lifetime_seconds,
                    memory_mb=memory_mb,
                    cpus=cpus,
                    pids=pids,
                    disk_mb=disk_mb,
                    metadata=metadata,
                    end_with_caller=end_with_caller,
                ),
                timeout=_create_timeout(tout),
            )
        except BaseException:
            await sbx.close()
            raise
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
        sbx = cls(id, url=url, token=token, timeout=timeout, config=config, state_dir=state_dir)
        try:
            await sbx.refresh()
        except BaseException:
            await sbx.close()
            raise
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
        config = config or resolve(url, token, state_dir)
        tr = _AsyncTransport(config, DEFAULT_TIMEOUT)
        try:
            body = await tr.request("GET", "/v1/sandboxes")
        finally:
            await tr.close()
        return [SandboxInfo.from_dict(s) for s in body.get("sandboxes", [])]

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen; call `await refresh()` for a fresh copy."""
        if self._info is None:
            raise RuntimeError("no information yet: await sandbox.refresh() first")
        return self._info

    async def refresh(self) -> SandboxInfo:
        self._info = SandboxInfo.from_dict(await self._transport.request("GET", f"/v1/sandboxes/{self.id}"))
        return self._info

    async def is_running(self) -> bool:
        try:
            return (await self.refresh()).state == V.RUNNING
        except (SandboxGone, SandboxNotFound):
            return False

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
    ) -> Execution:
        """See `Sandbox.run_code`. Cancelling the task closes the stream and so interrupts the cell."""
        body = _create_body(code=code, timeout_seconds=timeout_seconds, silent=silent, store_history=store_history)
        execution = Execution()
        saw_done = False
        tr = self._transport
        async with tr.stream(
            "POST", f"/v1/sandboxes/{self.id}/execute", json=body, timeout=_execute_timeout(tr.timeout)
        ) as response:
            try:
                async for line in response.aiter_lines():
                    event = _parse_line(line)
                    if event is None or saw_done:
                        # Read the stream to its end even after `done`: a response left
                        # unread closes its connection, and the next cell pays for a new one.
                        continue
                    execution._apply(event)
                    for fn, arg in _callbacks_for(
                        event, on_stdout, on_stderr, on_display, on_result, on_error, on_event
                    ):
                        await _call(fn, arg)
                    if event.get("type") == V.DONE:
                        saw_done = True
            except httpx.TransportError as exc:
                if not saw_done:
                    raise _transport_error(exc, tr.config) from exc
        _check_execute_done(execution, saw_done, tr.config)
        self._info = _info_after(self._info, execution)
        return execution

    async def interrupt(self) -> bool:
        body = await self._transport.request("POST", f"/v1/sandboxes/{self.id}/interrupt")
        return bool((body or {}).get("interrupted"))

    async def renew(self, ttl_seconds: int | None = None, *, extend_seconds: int | None = None) -> SandboxInfo:
        body = _create_body(ttl_seconds=ttl_seconds, extend_seconds=extend_seconds)
        self._info = SandboxInfo.from_dict(
            await self._transport.request("POST", f"/v1/sandboxes/{self.id}/renew", json=body)
        )
        return self._info

    async def delete(self) -> None:
        try:
            await self._transport.request("DELETE", f"/v1/sandboxes/{self.id}")
        except (SandboxGone, SandboxNotFound):
            pass
        if self._info is not None:
            self._info = dataclasses.replace(self._info, state=V.DELETED)

    async def complete(self, code: str, cursor_pos: int | None = None) -> dict[str, t.Any]:
        pos = len(code) if cursor_pos is None else cursor_pos
        return await self._transport.request(
            "POST", f"/v1/sandboxes/{self.id}/complete", json={"code": code, "cursor_pos": pos}
        )

    async def inspect(self, code: str, cursor_pos: int | None = None, detail_level: int = 0) -> dict[str, t.Any]:
        pos = len(code) if cursor_pos is None else cursor_pos
        return await self._transport.request(
            "POST",
            f"/v1/sandboxes/{self.id}/inspect",
            json={"code": code, "cursor_pos": pos, "detail_level": detail_level},
        )

    async def is_complete(self, code: str) -> dict[str, t.Any]:
        return await self._transport.request("POST", f"/v1/sandboxes/{self.id}/is_complete", json={"code": code})

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: t.Any) -> None:
        try:
            await self.delete()
        except SandboxError:
            if exc_info[0] is None:
                raise
        finally:
            await self.close()

    def __repr__(self) -> str:
        state = self._info.state if self._info else "?"
        return f"<AsyncSandbox {self.id} {state} at {self.config.url}>"


# --------------------------------------------------------------------------- module level


def list_sandboxes(
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> list[SandboxInfo]:
    """The live sandboxes on the server (on a shared server: the caller's own)."""
    tr = _SyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        body = tr.request("GET", "/v1/sandboxes")
    finally:
        tr.close()
    return [SandboxInfo.from_dict(s) for s in body.get("sandboxes", [])]


def health(
    *, url: str | None = None, timeout: float = 5.0, state_dir: str | os.PathLike | None = None
) -> dict[str, t.Any]:
    """`{"status": "ok", "version": ...}` if a server answers; ServerUnavailable if not.

    Needs no token, so it tells "no server" apart from "wrong token".
    """
    config = dataclasses.replace(resolve(url, None, state_dir), token=None, token_source="not needed")
    tr = _SyncTransport(config, _as_timeout(timeout))
    try:
        return tr.request("GET", "/v1/health")
    finally:
        tr.close()


def server_info(
    *,
    url: str | None = None,
    token: str | None = None,
    state_dir: str | os.PathLike | None = None,
    config: ServerConfig | None = None,
) -> dict[str, t.Any]:
    """The server's version, the isolation in force and the warm pool's state."""
    tr = _SyncTransport(config or resolve(url, token, state_dir), DEFAULT_TIMEOUT)
    try:
        return tr.request("GET", "/v1/info")
    finally:
        tr.close()
