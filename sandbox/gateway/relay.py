"""The gateway's front door: an HTTP/1.1 relay at the level of asyncio transports.

Why not uvicorn + Starlette for everything: on a trivial execute the gateway's own CPU was
4.5 ms (two cores: its CPU is latency), most of it building ASGI scopes, Starlette requests,
a StreamingResponse with its disconnect listener and a task per streamed chunk, and the
upstream client's request and response models. A call on one sandbox needs none of that:
the relay parses only the request head (httptools, the C parser uvicorn uses), checks the
token as the node does, or a user token (``callers.identify``), reads the node from the sandbox id
(``NodeTable.route``), and passes bytes both ways (``exchange.py``) over a kept-alive
connection to that node (``pool.py``).

Everything else (create and its placement, list merged over nodes, info, nodes, drain,
images, openapi, health) is the gateway's Starlette app (``app.py``), which the relay
reaches the same way over a unix socket only this process knows: one front port, one
parser for every client, one way of passing a request on.

Answers on one client connection go out in the order its requests came (HTTP/1.1
keep-alive and pipelining): each request is an ``Exchange`` in ``ClientConnection.queue``;
the first one is the one whose answer is being written, the others hold their bodies (a
bounded amount, then the client is not read) until their turn.
"""

from __future__ import annotations

import asyncio
import logging
import typing as t
import urllib.parse

import httptools

from ..common.errors import ApiError
from ..service import scopes
from . import callers
from .config import GatewayConfig
from .exchange import Exchange, error_answer
from .nodes import NodeTable
from .pool import AppUpstream

log = logging.getLogger("sandbox.gateway.relay")

SANDBOX_PREFIX = b"/v1/sandboxes/"
SCOPE_HEADER = scopes.HEADER.encode()
RELAYED_METHODS = frozenset((b"GET", b"POST", b"PUT", b"DELETE"))
# Routes whose answer may take as long as the cell: only the watchdog's node checks end
# them. Any other relayed call that gets no byte from its node for this long has failed.
OPEN_ENDED = (b"/execute", b"/comm")
READ_TIMEOUT = 120.0
HEAD_MAX_BYTES = 64 * 1024
# Requests a pipelining client may have waiting for their turn before it is not read.
PIPELINE_MAX = 16


class Relay:
    """What every client connection shares: the node table, the app's upstream, the token."""

    def __init__(self, config: GatewayConfig, table: NodeTable, app_socket: str):
        self.config = config
        self.table = table
        self.app = AppUpstream(app_socket)
        self.expected = f"Bearer {config.token}".encode()
        self.connections: set[ClientConnection] = set()

    def connection(self) -> "ClientConnection":
        return ClientConnection(self)

    def exchange_for(self, client: "ClientConnection", method: bytes, url: bytes,
                     headers: list[tuple[bytes, bytes]], keep_alive: bool) -> Exchange:
        """Where a request goes: a node (a call on one sandbox), the app (the rest), or an
        error answered here."""
        path = url.partition(b"?")[0]
        if not path.startswith(SANDBOX_PREFIX):
            return Exchange(client, keep_alive, upstream=self.app, method=method, target=url, headers=headers)
        raw_id = path[len(SANDBOX_PREFIX):].partition(b"/")[0]
        if not raw_id:  # "/v1/sandboxes/": the app's 404, as before
            return Exchange(client, keep_alive, upstream=self.app, method=method, target=url, headers=headers)
        try:
            user = callers.identify(_header(headers, b"authorization"), self.expected, self.config.user_secret)
            if user is not None:  # the node sees the user's scope, never the client's own
                declared = _header(headers, SCOPE_HEADER)
                scope = callers.user_scope(user, declared.decode("latin-1") if declared else None)
                headers = [h for h in headers if h[0] != SCOPE_HEADER] + [(SCOPE_HEADER, scope.encode())]
            if method not in RELAYED_METHODS:
                raise ApiError(405, "method_not_allowed", f"{method.decode()} is not allowed on {_text(path)}")
            length = _header(headers, b"content-length")
            limit = self.config.request_max_bytes
            if method == b"POST" and length.isdigit() and int(length) > limit:
                raise ApiError(413, "too_large", f"the request body is larger than the {limit} byte limit")
            sandbox_id = _text(raw_id)
            node = self.table.route(sandbox_id)
        except ApiError as exc:
            return Exchange(client, keep_alive, error=exc)
        return Exchange(client, keep_alive, upstream=node.upstream, table=self.table, node=node, sandbox_id=sandbox_id,
                        method=method, target=url, headers=headers,
                        read_timeout=None if path.endswith(OPEN_ENDED) else READ_TIMEOUT)

    async def close(self, grace: float) -> None:
        """Stop: idle connections close now, busy ones when their calls end (or after
        ``grace`` seconds)."""
        for conn in list(self.connections):
            conn.close_when_idle()
        deadline = asyncio.get_running_loop().time() + grace
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.cut()
        self.app.close()


class ClientConnection(asyncio.Protocol):
    """One client's TCP connection: parses its request heads, queues its calls, writes their
    answers in order, and carries flow control between the client and the calls."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: list[Exchange] = []    # [0]: the call whose answer goes out now
        self.reading: Exchange | None = None  # the call whose request is being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.holders: set = set()          # who asked that the client not be read
        self.write_paused = False
        self.closing = False
        self.gone = False
        self.refusal = ""                  # why the parser was stopped, when it was us
        # Batching: while the client's bytes are parsed, what goes to the node waits in its
        # call (``Exchange.flush``); while a node's bytes are parsed, what goes to the client
        # waits in ``out``: one write each way per batch instead of one per piece.
        self.parsing = False
        self.corked = False
        self.out: list[bytes] = []

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t.cast(asyncio.Transport, transport)
        self.relay.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.parsing = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse("protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse(self.refusal or f"malformed HTTP request ({exc})")
        finally:
            self.parsing = False
            if self.queue:
                self.queue[0].flush()

    def eof_received(self) -> bool | None:
        return None  # a client that half-closes is gone: close, which abandons its calls

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.relay.connections.discard(self)
        queue, self.queue = self.queue, []
        for exchange in queue:
            exchange.abandon()

    def pause_writing(self) -> None:  # the client reads a download slower than the node sends it
        self.write_paused = True
        if self.queue:
            self.queue[0].client_writing(True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.queue:
            self.queue[0].client_writing(False)

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.head_size = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self._count(len(name) + len(value))

    def on_headers_complete(self) -> None:
        exchange = self.relay.exchange_for(self, self.parser.get_method(), self.url, self.headers,
                                           self.parser.should_keep_alive())
        self.reading = exchange
        self.queue.append(exchange)
        if len(self.queue) == 1:
            exchange.start()
        elif len(self.queue) > PIPELINE_MAX:
            self.hold_reading("pipeline")

    def on_body(self, body: bytes) -> None:
        self.reading.request_body(body)

    def on_message_complete(self) -> None:
        exchange, self.reading = self.reading, None
        exchange.request_end()

    def _count(self, size: int) -> None:
        self.head_size += size
        if self.head_size > HEAD_MAX_BYTES:
            self.refusal = f"the request head is larger than {HEAD_MAX_BYTES} bytes"
            raise ValueError(self.refusal)  # stops the parser (HttpParserCallbackError)

    # -- for the calls
    def write(self, data: bytes) -> None:
        if self.corked:
            self.out.append(data)
        elif not self.gone:
            self.transport.write(data)

    def uncork(self) -> None:
        self.corked = False
        if self.out:
            out, self.out = self.out, []
            if not self.gone:
                self.transport.write(b"".join(out))

    def hold_reading(self, holder: object) -> None:
        if not self.holders and not self.gone:
            self.transport.pause_reading()
        self.holders.add(holder)

    def release_reading(self, holder: object) -> None:
        if holder in self.holders:
            self.holders.discard(holder)
            if not self.holders and not self.gone and not self.closing:
                self.transport.resume_reading()

    def exchange_ended(self, exchange: Exchange) -> None:
        if not self.queue or self.queue[0] is not exchange:
            return
        self.queue.pop(0)
        self.release_reading(exchange)
        if len(self.queue) <= PIPELINE_MAX:
            self.release_reading("pipeline")
        if not exchange.keep_alive or (self.closing and not self.queue):
            self.closing = True
            self.queue.clear()
            self.uncork()
            self.transport.close()
        elif self.queue:
            self.queue[0].start()

    def cut(self) -> None:
        """End the connection now (an answer that cannot be finished)."""
        self.uncork()  # what came before the cut is the client's
        if not self.gone:
            self.transport.abort()

    def close_when_idle(self) -> None:
        self.closing = True
        if not self.queue:
            self.transport.close()

    def _refuse(self, message: str) -> None:
        """A request the relay cannot read: answered 400 (after the answers before it), and
        the connection closes, since where the next request would start is unknown."""
        self.transport.pause_reading()
        self.closing = True
        exchange = Exchange(self, False, error=ApiError(400, "invalid_request", message))
        exchange.request_done = True
        if self.reading is not None and self.reading in self.queue:
            self.queue.remove(self.reading)  # half-read: its answer would never end
            self.reading.abandon()
            self.reading = None
        self.queue.append(exchange)
        if len(self.queue) == 1:
            exchange.start()


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    for key, value in headers:
        if key == name:
            return value
    return b""


def _text(raw: bytes) -> str:
    return urllib.parse.unquote(raw.decode("latin-1"))


__all__ = ["Relay", "ClientConnection", "error_answer"]
