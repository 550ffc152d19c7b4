"""The event stream's own HTTP/1.1: POST a JSON body and read the NDJSON answer, line by
line, on a kept connection, without httpx's layers.

Why: a trivial cell is one such request, and in the kernel the request through httpx,
httpcore, anyio and h11 cost about half of the kernel's CPU for the whole cell (py-spy on
benchmark 1). This path does only what the streaming routes (execute, commands, comm)
need: one request head written at once, a response head, a chunked or sized body, and
keep-alive. Everything else (other routes, https, a proxy named in the environment) stays
on httpx, and so does the mapping of errors: a transport failure is raised as the httpx
exception httpx would have raised, an HTTP error as an `httpx.Response` for
`error_from_response`, so callers see the same errors either way.

The parsing is here once (`Head`, `LineSplitter`, `ChunkedBody`); the two clients each have
their I/O: `AsyncEventConnections` (asyncio streams) and `EventConnections` (a blocking
socket), named so that scripts/unasync.py maps the one onto the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import typing as t
import urllib.request
from urllib.parse import urlsplit

import httpx

from ..service.endpoint import is_loopback
from .configuration import ServerConfig
from .errors import error_from_response

# A response head larger than this is not our server's.
MAX_HEAD = 64 * 1024


def lean_path(config: ServerConfig) -> tuple[str | None, str, int, str] | None:
    """(unix socket or None, host, port, path prefix) when this module can carry the
    server's event streams; None when httpx must (https, or a proxy the environment names
    for a non-loopback host, which httpx would honour)."""
    if config.socket:
        return config.socket, "sandbox-kernel", 0, ""
    parts = urlsplit(config.url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    host = parts.hostname
    if not is_loopback(host):
        proxies = urllib.request.getproxies()
        if proxies.get("http") or proxies.get("all"):
            return None
    return None, host, parts.port or 80, parts.path.rstrip("/")


def request_bytes(host_header: str, path: str, headers: dict[str, str], body: t.Any) -> bytes:
    """One POST with a JSON body, head and body in one write."""
    payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host_header}", "Accept: */*", "Content-Type: application/json",
             f"Content-Length: {len(payload)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class Head(t.NamedTuple):
    """A response's status line and headers, and how its body is framed."""

    status: int
    headers: list[tuple[str, str]]
    chunked: bool
    length: int | None  # Content-Length; None when chunked or read to the end
    keep_alive: bool

    @classmethod
    def parse(cls, raw: bytes) -> Head:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
        headers = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers.append((name.strip(), value.strip()))
        found = {k.lower(): v.lower() for k, v in headers}
        chunked = "chunked" in found.get("transfer-encoding", "")
        length = found.get("content-length")
        length_n = int(length) if length is not None and length.isdigit() and not chunked else None
        keep_alive = parts[0] == "HTTP/1.1" and found.get("connection") != "close" and (chunked or length_n is not None)
        return cls(int(parts[1]), headers, chunked, length_n, keep_alive)

    def error_response(self, body: bytes, url: str) -> httpx.Response:
        """The response as httpx would have given it, for `error_from_response`."""
        return httpx.Response(self.status, headers=self.headers, content=body, request=httpx.Request("POST", url))


class LineSplitter:
    """Body bytes in, whole lines out (a line may span chunks, a chunk may hold many)."""

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, data: bytes) -> list[str]:
        data = self.rest + data if self.rest else data
        cut = data.rfind(b"\n") + 1
        self.rest = data[cut:]
        return data[:cut].decode().splitlines() if cut else []

    def end(self) -> list[str]:
        rest, self.rest = self.rest, b""
        return [rest.decode()] if rest else []


def chunk_size(line: bytes) -> int:
    """The size in a chunk-size line (extensions after `;` ignored)."""
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad chunk size line {line[:40]!r}") from None


def _closed_while_idle(sock: t.Any) -> bool:
    """Whether a kept connection was closed (or sent anything) while it sat idle: then it
    is not reused. One poll, as httpcore does before reusing a connection."""
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class AsyncEventConnection:
    """One kept connection to the server."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def head(self) -> Head:
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError("response head too large") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc
        return Head.parse(raw)

    async def body(self, head: Head) -> t.AsyncIterator[bytes]:
        """The body's bytes as they come."""
        reader = self.reader
        try:
            if head.chunked:
                while True:
                    size = chunk_size(await reader.readuntil(b"\r\n"))
                    if size == 0:
                        await reader.readuntil(b"\r\n")  # no trailers from our server
                        return
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif head.length is not None:
                if head.length:
                    yield await reader.readexactly(head.length)
            else:
                while data := await reader.read(65536):
                    yield data
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise httpx.RemoteProtocolError("the server closed the stream mid-answer") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc

    def usable(self) -> bool:
        return not self.writer.is_closing() and not _closed_while_idle(self.writer.get_extra_info("socket"))

    def close(self) -> None:
        self.writer.close()


class _KeptConnections:
    """What both flavours keep: where the server is, and the connections idle between
    streams (one per stream at a time: a cell and a comm message may stream at once; a
    connection is returned only when its stream was read to its end)."""

    def __init__(self, config: ServerConfig, where: tuple[str | None, str, int, str], connect_timeout: float | None) -> None:
        self.config = config
        self.socket_path, self.host, self.port, self.prefix = where
        self.host_header = self.host if self.socket_path or self.port == 80 else f"{self.host}:{self.port}"
        self.connect_timeout = connect_timeout
        self.idle: list[t.Any] = []

    def _idle_connection(self) -> t.Any:
        """A kept connection the server has not closed, or None."""
        while self.idle:
            conn = self.idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _request(self, path: str, body: t.Any) -> bytes:
        return request_bytes(self.host_header, self.prefix + path, self.config.headers, body)

    def _http_error(self, head: Head, data: bytes, path: str) -> Exception:
        return error_from_response(head.error_response(data, self.config.url + path), self.config)

    def _release(self, conn: t.Any, kept: bool) -> None:
        if kept:
            self.idle.append(conn)
        else:
            conn.close()

    def _close_idle(self) -> None:
        while self.idle:
            self.idle.pop().close()


class AsyncEventConnections(_KeptConnections):
    """Kept connections to one server for event streams (the async client's)."""

    async def _connection(self) -> AsyncEventConnection:
        kept = self._idle_connection()
        if kept is not None:
            return kept
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.socket_path:
                    reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=MAX_HEAD)
                else:
                    reader, writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEAD)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return AsyncEventConnection(reader, writer)

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: t.Any) -> t.AsyncIterator[t.AsyncIterator[str]]:
        """POST `body` to `path`; the answer's lines. Raises httpx's transport errors, and
        our error for an HTTP error status (read whole first)."""
        conn = await self._connection()
        kept = False
        try:
            try:
                conn.writer.write(self._request(path, body))
            except OSError as exc:
                raise httpx.WriteError(str(exc)) from exc
            head = await conn.head()
            if head.status >= 300:
                raise self._http_error(head, b"".join([part async for part in conn.body(head)]), path)
            finished: list[bool] = []
            yield self._lines(conn, head, finished)
            kept = bool(finished) and head.keep_alive
        finally:
            self._release(conn, kept)

    async def _lines(self, conn: AsyncEventConnection, head: Head, finished: list[bool]) -> t.AsyncIterator[str]:
        split = LineSplitter()
        async for data in conn.body(head):
            for line in split.feed(data):
                yield line
        for line in split.end():
            yield line
        finished.append(True)

    async def aclose(self) -> None:
        self._close_idle()


class EventConnection:
    """One kept connection to the server (the blocking client's)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rb")

    def _line(self) -> bytes:
        line = self.file.readline(MAX_HEAD)
        if not line.endswith(b"\n"):
            raise httpx.RemoteProtocolError("the server closed the stream mid-answer")
        return line

    def head(self) -> Head:
        try:
            first = self.file.readline(MAX_HEAD)
            if not first:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            lines = [first]
            while lines[-1] not in (b"\r\n", b"\n"):
                lines.append(self._line())
                if sum(map(len, lines)) > MAX_HEAD:
                    raise httpx.RemoteProtocolError("response head too large")
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc
        return Head.parse(b"".join(lines))

    def body(self, head: Head) -> t.Iterator[bytes]:
        """The body's bytes as they come."""
        try:
            if head.chunked:
                while True:
                    size = chunk_size(self._line())
                    if size == 0:
                        self._line()
                        return
                    data = self.file.read(size + 2)
                    if len(data) < size + 2:
                        raise httpx.RemoteProtocolError("the server closed the stream mid-answer")
                    yield data[:-2]
            elif head.length is not None:
                data = self.file.read(head.length)
                if len(data) < head.length:
                    raise httpx.RemoteProtocolError("the server closed the stream mid-answer")
                if data:
                    yield data
            else:
                while data := self.file.read1(65536):
                    yield data
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc

    def usable(self) -> bool:
        return self.sock.fileno() >= 0 and not _closed_while_idle(self.sock)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class EventConnections(_KeptConnections):
    """`AsyncEventConnections` for the blocking client: the same, on blocking sockets."""

    def _connection(self) -> EventConnection:
        kept = self._idle_connection()
        if kept is not None:
            return kept
        try:
            if self.socket_path:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(self.connect_timeout)
                    sock.connect(self.socket_path)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)  # no read timeout: a cell may print nothing for hours
        except socket.timeout as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return EventConnection(sock)

    @contextlib.contextmanager
    def stream(self, path: str, body: t.Any) -> t.Iterator[t.Iterator[str]]:
        """POST `body` to `path`; the answer's lines (see `AsyncEventConnections.stream`)."""
        conn = self._connection()
        kept = False
        try:
            try:
                conn.sock.sendall(self._request(path, body))
            except OSError as exc:
                raise httpx.WriteError(str(exc)) from exc
            head = conn.head()
            if head.status >= 300:
                raise self._http_error(head, b"".join(conn.body(head)), path)
            finished: list[bool] = []
            yield self._lines(conn, head, finished)
            kept = bool(finished) and head.keep_alive
        finally:
            self._release(conn, kept)

    def _lines(self, conn: EventConnection, head: Head, finished: list[bool]) -> t.Iterator[str]:
        split = LineSplitter()
        for data in conn.body(head):
            yield from split.feed(data)
        yield from split.end()
        finished.append(True)

    def close(self) -> None:
        self._close_idle()
