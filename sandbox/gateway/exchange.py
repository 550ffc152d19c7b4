"""One request from a client and its answer, relayed through an upstream connection.

The request's head is rewritten (the node's token, the headers the node needs, the body's
framing) and its body goes on piece by piece as the client sends it; the answer's head is
rewritten the same way and its body comes back piece by piece as the upstream sends it.
Flow control is the transports' own: an upstream that takes an upload slowly stops the
relay reading the client, a client that reads a download slowly stops the relay reading the
upstream, so a call holds a read buffer's worth of bytes whatever the size of its body.

What used to be a task and a timeout per chunk is now state: each call records when its
upstream last moved, and the watchdog (``sandbox/gateway/watchdog.py``) ends the calls of a
node that stopped answering. An execute's NDJSON stream then ends with an ``error`` and a
``done`` event that say so, as a node's own stream ends when its sandbox dies, never with a
torn line or a hang: that is why NDJSON answers are passed on whole lines at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import typing as t
from functools import lru_cache
from http import HTTPStatus

from ..service.api import NDJSON
from ..common.errors import ApiError
from ..runtime import vocabulary as V
from .nodes import NODE_UNAVAILABLE, Node, NodeTable, no_answer
from .pool import UpstreamConnection, Upstream
from .sides import ClientSide

log = logging.getLogger("sandbox.gateway.relay")

LAST_CHUNK = b"0\r\n\r\n"
# Request body bytes held for a call that has no upstream connection yet (it waits for one,
# or for the calls before it on a pipelining connection): past this the client is not read.
HELD_BODY_MAX = 256 * 1024


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@lru_cache(maxsize=64)
def status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


def error_answer(exc: ApiError, keep_alive: bool) -> bytes:
    """The JSON error every route answers with (``api.error_response``), as bytes."""
    body = json.dumps(exc.body(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    head = status_line(exc.status) + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    if exc.status == 401:
        head += b"www-authenticate: Bearer\r\n"
    if not keep_alive:
        head += b"connection: close\r\n"
    return head + b"\r\n" + body


class Exchange:
    """A call relayed to ``upstream``; ``node`` and ``sandbox_id`` are set for a node's."""

    def __init__(self, client: ClientSide, keep_alive: bool, *, error: ApiError | None = None,
                 upstream: Upstream | None = None, table: NodeTable | None = None, node: Node | None = None,
                 sandbox_id: str | None = None, method: bytes = b"", target: bytes = b"",
                 headers: t.Sequence[tuple[bytes, bytes]] = (), read_timeout: float | None = None):
        self.client = client
        self.keep_alive = keep_alive
        self.error = error
        self.upstream, self.table, self.node, self.sandbox_id = upstream, table, node, sandbox_id
        self.read_timeout = read_timeout
        self.progress_at = time.monotonic()
        self.conn: UpstreamConnection | None = None
        self.connecting: asyncio.Task | None = None
        self.held: list[bytes] = []       # request bytes waiting for a connection
        self.held_size = 0
        self.request_done = False         # the client has sent the whole request
        self.discard_body = error is not None
        self.answer_started = False       # its head has gone to the client
        self.answered = False             # the whole answer has gone to the client
        self.chunked_request = False
        self.chunked_answer = False
        self.ndjson = False
        self.tail = b""                   # NDJSON: the start of a line whose end has not come
        self.last_lines = b""             # NDJSON: the last whole lines passed on
        self.ended = False
        self.head_only = method == b"HEAD"  # an answer to HEAD has a head and no body
        if upstream is not None:
            self.held.append(self._request_head(method, target, headers))

    def _request_head(self, method: bytes, target: bytes, headers: t.Sequence[tuple[bytes, bytes]]) -> bytes:
        upstream = self.upstream
        lines = [method, b" ", target, b" HTTP/1.1\r\n", upstream.fixed_head]
        length = None
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                self.chunked_request = b"chunked" in value.lower()
            elif upstream.passes_header(name):
                lines += (name, b": ", value, b"\r\n")
        if self.chunked_request:
            lines.append(b"transfer-encoding: chunked\r\n")
        elif length is not None:
            lines += (b"content-length: ", length, b"\r\n")
        elif method in (b"POST", b"PUT"):
            lines.append(b"content-length: 0\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    # ------------------------------------------------------------------ from the client
    def start(self) -> None:
        """This call's turn: its answer is the next the client connection writes."""
        if self.error is not None:
            self._answer_error(self.error)
            return
        if self.node is not None:
            self.node.calls.add(self)
        conn = self.upstream.pool.take()
        if conn is not None:
            self._attach(conn)
        else:
            self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        try:
            conn = await self.upstream.connect()
        except asyncio.CancelledError:
            raise
        except (OSError, asyncio.TimeoutError) as exc:
            self.connecting = None
            if self.node is not None:
                self._fail(self.table.not_reached(self.node, self.sandbox_id, exc), "")
            else:
                log.error("the gateway's app socket refused a connection: %s", exc)
                self._fail(ApiError(503, "unavailable", "the gateway is shutting down"), "")
            return
        self.connecting = None
        if self.ended:
            conn.transport.close()
            return
        self._attach(conn)

    def _attach(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        conn.exchange = self
        if self.client.write_paused:
            conn.transport.pause_reading()
        if not self.client.parsing:  # (else once the client's bytes at hand are parsed)
            self.flush()

    def flush(self) -> None:
        """Write what is held to the connection: once per batch of the client's bytes, so
        that a request's head and body go to the node in one write."""
        if self.held and self.conn is not None:
            held, self.held, self.held_size = self.held, [], 0
            self.conn.transport.write(b"".join(held))
            self.progress_at = time.monotonic()
            self.client.release_reading(self)

    def request_body(self, data: bytes) -> None:
        if self.discard_body:
            return
        self.held.append(chunk(data) if self.chunked_request else data)
        if self.conn is None:
            self.held_size += len(data)
            if self.held_size > HELD_BODY_MAX:
                self.client.hold_reading(self)
        elif not self.client.parsing:
            self.flush()

    def request_end(self) -> None:
        self.request_done = True
        if self.chunked_request and not self.discard_body:
            self.held.append(LAST_CHUNK)
            if not self.client.parsing:
                self.flush()
        if self.answered:
            self._end()

    def client_writing(self, paused: bool) -> None:
        if self.conn is not None and not self.conn.closed:
            (self.conn.transport.pause_reading if paused else self.conn.transport.resume_reading)()

    def abandon(self) -> None:
        """The client went away: so does the call. Closing its connection is what tells the
        node (an execute whose caller left is interrupted there)."""
        self.ended = True
        if self.node is not None:
            self.node.calls.discard(self)
        if self.connecting is not None:
            self.connecting.cancel()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.exchange = None
            conn.transport.abort()

    # ------------------------------------------------------------------ from the upstream
    def answer_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        returns = self.upstream.returns_header
        lines = [status_line(status)]
        length = None
        chunked = False
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif returns(name):
                if name == b"content-type" and value.startswith(NDJSON.encode()):
                    self.ndjson = True
                lines += (name, b": ", value, b"\r\n")
        if self.head_only:
            if length is not None:
                lines += (b"content-length: ", length, b"\r\n")
        elif self.ndjson or (chunked and length is None):
            self.chunked_answer = True
            lines.append(b"transfer-encoding: chunked\r\n")
        elif length is not None:
            lines += (b"content-length: ", length, b"\r\n")
        if not self.keep_alive:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        self.answer_started = True
        self.client.write(b"".join(lines))
        if self.head_only:
            # The upstream's parser cannot tell a HEAD answer ends here (it does not know
            # the method): the answer is complete, and the connection is not reused.
            self.answer_end(False)

    def answer_body(self, data: bytes) -> None:
        if self.ndjson:
            data = self.tail + data if self.tail else data
            cut = data.rfind(b"\n") + 1
            if cut == len(data):
                self.tail = b""
            else:
                self.tail, data = data[cut:], data[:cut]
            if data:
                self.last_lines = data
                self.client.write(chunk(data))
        elif self.chunked_answer:
            self.client.write(chunk(data))
        else:
            self.client.write(data)

    def answer_end(self, reusable: bool) -> None:
        if self.chunked_answer:
            self.client.write(chunk(self.tail) + LAST_CHUNK if self.tail else LAST_CHUNK)
        conn, self.conn = self.conn, None
        # A connection whose request the upstream answered before reading all of it is not
        # at the start of a request: it cannot serve another.
        conn.release(reusable and self.request_done)
        if not self.request_done:
            self.discard_body = True
        self.answered = True
        if self.request_done:
            self._end()

    def upstream_broke(self, exc: BaseException) -> None:
        """The connection failed (reset, closed, or not HTTP) before the answer ended."""
        self.conn = None
        node = self.node
        if node is None:
            self._fail(ApiError(503, "unavailable", "the gateway's app broke off its answer"), "")
            return
        self._fail(no_answer(node, exc),
                   f"the connection to the node {node.node_id} broke while the cell ran ({type(exc).__name__})")

    # ------------------------------------------------------------------ from the watchdog
    def node_lost(self) -> None:
        node = self.node
        self._fail(self.table.silent(node, self.sandbox_id),
                   f"the node {node.node_id} stopped answering ({node.error}) while the cell ran")

    def timed_out(self) -> None:
        node = self.node
        self._fail(ApiError(503, "unavailable", f"the node {node.node_id} sent nothing for {self.read_timeout:.0f} s",
                            extra={"reason": NODE_UNAVAILABLE}), "")

    # ------------------------------------------------------------------ endings
    def _fail(self, before_answer: ApiError, during_events: str) -> None:
        """End a call whose upstream failed: an error answer if nothing went out yet, the
        closing events of an execute stream, or else a cut (the client sees a transfer that
        did not finish: its Content-Length or last chunk never comes)."""
        if self.ended or self.answered:
            return
        if self.connecting is not None:
            self.connecting.cancel()
            self.connecting = None
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.exchange = None
            conn.transport.abort()
        if not self.answer_started:
            self._answer_error(before_answer)
        elif self.ndjson and during_events:
            if not _ends_with_done(self.last_lines):
                # Whether the node is gone for good is for the next call to tell (503, then
                # 410); no sandbox_state: nobody knows it.
                events = (_event(V.reason_error_event(NODE_UNAVAILABLE, during_events + "; the cell's outcome is unknown"))
                          + _event(V.done_event(V.ERROR, reason=NODE_UNAVAILABLE)))
                self.client.write(chunk(events))
            self.client.write(LAST_CHUNK)
            self.discard_body = True
            self.answered = True
            if self.request_done:
                self._end()
        else:
            log.warning("node %s broke off an answer: %s", self.node.node_id if self.node else "-", during_events)
            self.ended = True
            if self.node is not None:
                self.node.calls.discard(self)
            self.client.cut()

    def _answer_error(self, exc: ApiError) -> None:
        self.answer_started = self.answered = True
        self.discard_body = True
        self.client.release_reading(self)
        self.client.write(error_answer(exc, self.keep_alive))
        if self.request_done:
            self._end()

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.node is not None:
            self.node.calls.discard(self)
        self.client.exchange_ended(self)


def _ends_with_done(lines: bytes) -> bool:
    start = lines.rfind(b"\n", 0, len(lines) - 1) + 1
    try:
        return json.loads(lines[start:]).get("type") == V.DONE
    except (ValueError, AttributeError):
        return False


def _event(event: dict) -> bytes:
    return (json.dumps(event) + "\n").encode()
