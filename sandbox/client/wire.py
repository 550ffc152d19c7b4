"""What both clients send and read the same way: request bodies, file URLs, upload
chunks, the event stream's lines and which callback an event goes to.

Pure functions (no I/O on the server), so the async client and the sync one generated
from it (async_client.py, sync_client.py) share one copy.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import io
import json
import os
import pathlib
import typing as t
from urllib.parse import quote

import httpx

from ..runtime import vocabulary as V
from .configuration import ServerConfig
from .errors import InvalidRequest, ServerUnavailable

CHUNK_SIZE = 1024 * 1024

Callback = t.Callable[[t.Any], t.Any]
FileData = t.Union[bytes, bytearray, memoryview, str, pathlib.Path, t.BinaryIO, t.Iterable[bytes]]
Progress = t.Callable[[int, t.Optional[int]], t.Any]
# Which callbacks an event goes to, with what argument (command_callbacks, execute_callbacks).
EventRoute = t.Callable[[dict[str, t.Any]], t.List[t.Tuple[Callback, t.Any]]]


def command_body(
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
    return {**body, **drop_none(cwd=cwd, env=env, timeout_seconds=timeout)}


def command_callbacks(
    event: dict[str, t.Any], on_stdout: Callback | None, on_stderr: Callback | None, on_start: Callback | None
) -> list[tuple[Callback, t.Any]]:
    kind = event.get("type")
    if kind == V.STREAM:
        target = on_stderr if event.get("name") == V.STDERR else on_stdout
        return [(target, event.get("text", ""))] if target else []
    if kind == V.START and on_start:
        return [(on_start, event.get("command_id"))]
    return []


def execute_callbacks(
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



def file_url(sandbox_id: str, path: str) -> str:
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


def total_size(data: t.Any) -> int | None:
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


def iter_upload(data: t.Any, progress: Progress | None, total: int | None) -> t.Iterator[bytes]:
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


async def aiter_upload(data: t.Any, progress: Progress | None, total: int | None) -> t.AsyncIterator[bytes]:
    """Async twin of `iter_upload`: disk reads run in a thread to keep the loop free."""
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
        for chunk in iter_upload(data, progress, total):
            yield chunk
        return
    iterator = iter_upload(data, progress, total)
    sentinel = object()
    while True:
        chunk = await asyncio.to_thread(next, iterator, sentinel)
        if chunk is sentinel:
            return
        yield t.cast(bytes, chunk)


def upload_data(data: t.Any) -> t.Any:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, os.PathLike) and not isinstance(data, pathlib.Path):
        return pathlib.Path(data)
    return data


def check_stream_done(saw_done: bool, config: ServerConfig, what: str) -> None:
    """A stream that ended without `done`: the server went away mid-run, and `what` may
    have partly run (so it is not retried)."""
    if not saw_done:
        raise ServerUnavailable(
            "stream_ended",
            f"the sandbox server at {config.url} ended the stream of {what} before it finished "
            f"(server restarted or connection lost); {what} may have partly run",
        )


def parse_line(line: str) -> dict[str, t.Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def drop_none(**fields: t.Any) -> dict[str, t.Any]:
    return {k: v for k, v in fields.items() if v is not None}

def content_length(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["Content-Length"])
    except (KeyError, ValueError):
        return None


def check_size(path: str, size: int | None, max_bytes: int | None) -> None:
    """Refuse a download past the caller's cap, by what the server announced or what came."""
    if max_bytes is not None and size is not None and size > max_bytes:
        raise InvalidRequest("too_large", f"{path!r} is larger than the {max_bytes} bytes this call may read", 413)


class Sink:
    """Where a download goes: a file object as given, or a path written through a
    temporary sibling renamed at the end (removed on failure)."""

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


def call(fn: Callback, arg: t.Any) -> None:
    """A callback of the sync client: a plain call."""
    fn(arg)


async def acall(fn: Callback, arg: t.Any) -> None:
    """A callback of the async client: a plain function or a coroutine function."""
    result = fn(arg)
    if inspect.isawaitable(result):
        await result

