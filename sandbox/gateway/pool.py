"""Kept-alive HTTP/1.1 connections from the gateway's relay to one upstream: a node server,
or the gateway's own app on its private unix socket.

A relayed call borrows one idle connection (or opens one), writes its request head and body
to it as raw bytes, and gets the answer back through httptools' response parser, which finds
where the answer ends (Content-Length or chunked) so that the connection can serve the next
call. Nothing here reads a body into memory: each piece goes to the call as it comes
(``sandbox/gateway/exchange.py``). An idle connection that the upstream closes is forgotten
the moment it closes; one idle for longer than ``IDLE_SECONDS`` is not lent again, since the
upstream may be closing it just as a request goes out (uvicorn, which serves the nodes,
drops connections idle for 5 s), and a request lost that way cannot be retried.
"""

from __future__ import annotations

import asyncio
import time
import typing as t

import httptools

from .discovery import Target
from .sides import AnswerSink

# Request headers a node gets from the client; the relay writes Host, Authorization (the
# node's token) and the body's framing itself.
NODE_REQUEST_HEADERS = frozenset((b"content-type", b"accept", b"sandbox-scope"))  # the node checks the scope
# Response headers a client gets from a node; the relay writes the framing itself.
NODE_RESPONSE_HEADERS = frozenset((b"content-type", b"cache-control", b"x-accel-buffering", b"www-authenticate"))
# Hop-by-hop headers (and the framing, which the relay writes): never passed on as they are.
IDLE_SECONDS = 4.0
HOP_BY_HOP = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"trailer",
                        b"upgrade", b"expect", b"proxy-connection"))


class UpstreamConnection(asyncio.Protocol):
    """One connection to an upstream; lent to one call (``exchange``) at a time."""

    def __init__(self, pool: "Pool"):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: AnswerSink | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # an idle connection is not spoken to: whatever this is, drop it
            self.transport.abort()
            return
        exchange.progress_at = time.monotonic()
        client = exchange.client
        client.corked = True  # what this batch makes for the client goes out in one write
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.exchange = None
            self.transport.abort()
            exchange.upstream_broke(exc)
        finally:
            client.uncork()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.upstream_broke(exc or ConnectionResetError("the connection closed before the answer ended"))

    def pause_writing(self) -> None:  # the upstream takes an upload slower than the client sends it
        if self.exchange is not None:
            self.exchange.client.hold_reading(self)

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.progress_at = time.monotonic()
            self.exchange.client.release_reading(self)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        headers, self.headers = self.headers, []
        self.exchange.answer_head(self.parser.get_status_code(), headers)

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:  # (None: the call was done with the answer at its head)
            self.exchange.answer_body(body)

    def on_message_complete(self) -> None:
        if self.exchange is not None:
            self.exchange.answer_end(self.parser.should_keep_alive())

    # -- for the exchange
    def release(self, reusable: bool) -> None:
        """The call is done with this connection: back to the idle ones, or closed."""
        self.exchange = None
        if reusable and not self.closed:
            self.pool.keep(self)
        elif not self.closed:
            self.transport.abort()


class Pool:
    """The idle connections to one upstream, newest first."""

    def __init__(self, max_idle: int, idle_seconds: float = IDLE_SECONDS):
        self.max_idle = max_idle
        self.idle_seconds = idle_seconds
        self.idle: list[UpstreamConnection] = []

    def take(self) -> UpstreamConnection | None:
        fresh_since = time.monotonic() - self.idle_seconds
        while self.idle:
            conn = self.idle.pop()
            if conn.closed:
                continue
            if conn.idle_since >= fresh_since:
                return conn
            conn.transport.close()  # too old to trust; the older ones below it too
            for stale in self.idle:
                stale.transport.close()
            self.idle.clear()
        return None

    def keep(self, conn: UpstreamConnection) -> None:
        if len(self.idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            conn.transport.close()

    def forget(self, conn: UpstreamConnection) -> None:
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def close(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.transport.close()


class NodeUpstream:
    """A node server: the one address it proved itself at (``discovery.Target``: connections
    go there, never to another address of its URL's host name), the head every relayed
    request gets (its URL's Host, the node's token in place of the client's), and its pool."""

    def __init__(self, target: Target, token: str, connect_timeout: float, *, max_idle: int = 200):
        import httpx  # only for parsing the address as the gateway's other calls do

        url = httpx.URL(target.url)
        self.host, self.port = target.ip, target.port
        self.connect_timeout = connect_timeout
        self.fixed_head = f"host: {url.netloc.decode()}\r\nauthorization: Bearer {token}\r\n".encode()
        self.pool = Pool(max_idle)
        self.passes_header = NODE_REQUEST_HEADERS.__contains__
        self.returns_header = NODE_RESPONSE_HEADERS.__contains__

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: UpstreamConnection(self.pool), self.host, self.port), self.connect_timeout)
        return conn

    def close(self) -> None:
        self.pool.close()


# How long the app's uvicorn keeps an idle connection from the relay (it is the only client).
APP_KEEP_ALIVE_SECONDS = 300


class AppUpstream:
    """The gateway's own Starlette app (create, list, info, nodes, drain, openapi) behind a
    unix socket only this process uses: requests go to it as the client sent them (its own
    token check answers a wrong token), answers come back as it sent them."""

    def __init__(self, socket_path: str, *, max_idle: int = 50):
        self.socket_path = socket_path
        self.fixed_head = b""
        self.pool = Pool(max_idle, APP_KEEP_ALIVE_SECONDS - 5)
        self.passes_header = lambda name: name not in HOP_BY_HOP
        self.returns_header = self.passes_header

    async def connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_unix_connection(lambda: UpstreamConnection(self.pool), self.socket_path)
        return conn

    def close(self) -> None:
        self.pool.close()


Upstream = t.Union[NodeUpstream, AppUpstream]
