"""Passing one request through to a node and its answer back, streamed both ways.

Uploads go to the node as they arrive and downloads come back as the node sends them, so
the gateway holds a chunk at a time whatever the file's size (uvicorn stops reading a
client that sends faster than the node takes, and waits for a client that reads slower).
An execute's NDJSON events are passed on whole lines at a time: if the node vanishes
mid-cell, the stream ends with an ``error`` and a ``done`` event that say so, as a node's
own stream ends when its sandbox dies, instead of a torn line or a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import typing as t

import anyio
import httpcore
import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..api import NDJSON
from ..errors import ApiError
from ..runtime import vocabulary as V
from . import upstream
from .nodes import NODE_UNAVAILABLE, Node, NodeTable

log = logging.getLogger("sandbox.gateway.proxy")

REQUEST_HEADERS = (b"content-type", b"content-length", b"accept")  # ASGI header names are lower case
RESPONSE_HEADERS = (b"content-type", b"content-length", b"cache-control", b"x-accel-buffering", b"www-authenticate")
# A passed-through call other than an execute that gets no byte for this long has failed.
DEFAULT_READ_TIMEOUT = 120.0
T = t.TypeVar("T")
# How often an execute stream waiting for its next event checks that its node is still up.
WATCH_SECONDS = 1.0


class NotSent(ApiError):
    """The request never reached the node (no connection): safe to try another node."""


def _no_answer(node: Node, exc: Exception) -> ApiError:
    return ApiError(503, "unavailable", f"the node {node.node_id} did not answer ({type(exc).__name__}: {exc})",
                    extra={"reason": NODE_UNAVAILABLE})


class Proxy:
    def __init__(self, table: NodeTable):
        self.table = table

    async def send(self, node: Node, method: str, path: str, *, sandbox_id: str | None = None,
                   headers: dict[str, str] | None = None, content: t.Any = None,
                   params: t.Any = None, timeout: t.Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Response:
        """One of the gateway's own calls (create, list, drain), through the node's httpx
        client; the answer's body is left to the caller to read or stream."""
        request = node.client.build_request(method, path, headers=headers, content=content, params=params,
                                            timeout=timeout)
        try:
            return await self._watched(node, sandbox_id, node.client.send(request, stream=True))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._not_sent(node, sandbox_id, exc) from None
        except httpx.TransportError as exc:  # may have reached the node: never retried
            raise _no_answer(node, exc) from None

    async def _open(self, node: Node, method: str, target: bytes, sandbox_id: str | None,
                    headers: list[tuple[bytes, bytes]], content: t.Any, read_timeout: float | None) -> httpcore.Response:
        """A passed-through call, through the node's raw pool (sandbox/gateway/upstream.py)."""
        try:
            return await self._watched(node, sandbox_id, node.upstream.open(method, target, headers, content, read_timeout))
        except upstream.NOT_CONNECTED as exc:
            raise self._not_sent(node, sandbox_id, exc) from None
        except upstream.FAILED as exc:
            raise _no_answer(node, exc) from None

    async def _watched(self, node: Node, sandbox_id: str | None, sending: t.Awaitable[T]) -> T:
        """``sending``, given up on when the node is lost while it waits for an answer.

        A connection that cannot be made means the request never reached the node: the
        node is marked down and the caller gets the 503/410 the table gives. Any later
        failure may have reached it, so it is a 503 that says so (never retried here).
        """
        task = asyncio.ensure_future(sending)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_SECONDS)
                if done:
                    return task.result()
                if self.lost(node):  # connected, but the node went silent: do not wait on it
                    task.cancel()
                    error = self.table.unreachable(sandbox_id, node.node_id or "?", node) if sandbox_id else None
                    raise error or ApiError(503, "unavailable", f"the node {node.node_id} stopped answering",
                                            extra={"reason": NODE_UNAVAILABLE})
        except asyncio.CancelledError:
            task.cancel()
            raise

    def _not_sent(self, node: Node, sandbox_id: str | None, exc: Exception) -> NotSent:
        node.mark_down(f"not answering ({type(exc).__name__})")
        if sandbox_id is None:
            return NotSent(503, "unavailable", f"the node {node.node_id} is not answering",
                           extra={"reason": NODE_UNAVAILABLE})
        err = self.table.unreachable(sandbox_id, node.node_id or "?", node)
        return NotSent(err.status, err.code, err.message, err.extra)

    async def forward(self, request: Request, node: Node, sandbox_id: str | None, body: t.Any) -> Response:
        """``request`` as the node answers it; ``body`` is bytes or an async iterator."""
        # The path as the client sent it, still percent-encoded: a file name may hold '?' or '%'.
        target = request.scope.get("raw_path") or request.url.path.encode()
        if request.scope.get("query_string"):
            target += b"?" + request.scope["query_string"]
        # An execute (or a comm message) may run for as long as its own timeout says; the
        # node-down watch (below) is what keeps it from hanging on a node that vanished.
        read_timeout = None if request.url.path.endswith(("/execute", "/comm")) else DEFAULT_READ_TIMEOUT
        wanted = [(k, v) for k, v in request.scope["headers"] if k in REQUEST_HEADERS]
        answer = await self._open(node, request.method, target, sandbox_id, wanted, body, read_timeout)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in answer.headers
                   if k.lower() in RESPONSE_HEADERS}
        kind = headers.get("content-type", "")
        if kind.startswith(NDJSON):
            headers.pop("content-length", None)
            return StreamingResponse(self._events(answer, node), status_code=answer.status, headers=headers)
        if kind.startswith("application/octet-stream"):
            return StreamingResponse(self._raw(answer, node), status_code=answer.status, headers=headers)
        try:
            content = await answer.aread()
        except upstream.FAILED as exc:
            raise ApiError(503, "unavailable", f"the node {node.node_id} broke off its answer "
                           f"({type(exc).__name__})", extra={"reason": NODE_UNAVAILABLE}) from None
        finally:
            await answer.aclose()
        return Response(content, status_code=answer.status, headers=headers)

    def lost(self, node: Node) -> bool:
        """The node has failed its checks for a whole timeout more: calls in flight on it
        end, rather than wait for a TCP timeout (a host that vanished sends no reset). One
        slow /v1/info alone does not end them."""
        return (not node.up and node.down_since is not None
                and time.monotonic() - node.down_since >= self.table.config.node_timeout_seconds)

    @staticmethod
    async def _close(answer: httpcore.Response) -> None:
        # Shielded: when the client went away, this runs in a cancelled scope, and the node
        # must still see its connection close (that interrupts the cell it was running).
        with anyio.CancelScope(shield=True):
            await answer.aclose()

    async def _raw(self, answer: httpcore.Response, node: Node) -> t.AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_stream():
                yield chunk
        except upstream.FAILED as exc:
            # Headers (and Content-Length) are out: all that is left is to cut the answer
            # short, which the client sees as a transfer that did not finish.
            log.warning("node %s broke off a download: %s", node.node_id, exc)
        finally:
            await self._close(answer)

    async def _events(self, answer: httpcore.Response, node: Node) -> t.AsyncIterator[bytes]:
        chunks = answer.aiter_stream()
        pending: asyncio.Future | None = None
        tail = b""        # the start of a line whose end has not come yet
        last_line = b""   # the last whole line passed on, to tell whether it was `done`
        why = ""
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(chunks.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=WATCH_SECONDS)
                if not done:
                    if self.lost(node):
                        why = f"the node {node.node_id} stopped answering ({node.error}) while the cell ran"
                        break
                    continue
                future, pending = pending, None
                try:
                    chunk = future.result()
                except StopAsyncIteration:
                    break
                except upstream.FAILED as exc:
                    why = f"the connection to the node {node.node_id} broke while the cell ran ({type(exc).__name__})"
                    break
                data = tail + chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    start = data.rfind(b"\n", 0, cut - 1) + 1
                    last_line = data[start:cut]
                    yield data[:cut]
                tail = data[cut:]
            if why and not _is_done(last_line):
                # Whether the node is gone for good is for the next call to tell (503, then 410);
                # no sandbox_state: nobody knows it.
                yield _event(V.reason_error_event(NODE_UNAVAILABLE, why + "; the cell's outcome is unknown"))
                yield _event(V.done_event(V.ERROR, reason=NODE_UNAVAILABLE))
        finally:
            if pending is not None:
                pending.cancel()
            await self._close(answer)


def _is_done(line: bytes) -> bool:
    try:
        return json.loads(line).get("type") == V.DONE
    except (ValueError, AttributeError):
        return False


def _event(event: dict) -> bytes:
    return (json.dumps(event) + "\n").encode()
