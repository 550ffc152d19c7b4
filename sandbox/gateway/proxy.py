"""The gateway's own calls to a node (create, list, drain, images), through the node's
httpx client; the answer's body is left to the caller to read.

Calls on one sandbox do not come here: the relay passes them through as bytes
(``sandbox/gateway/relay.py``).
"""

from __future__ import annotations

import asyncio
import typing as t

import httpx

from ..common.errors import ApiError
from .nodes import Node, NodeTable, no_answer
from .watchdog import WATCH_SECONDS

T = t.TypeVar("T")


class NotSent(ApiError):
    """The request never reached the node (no connection): safe to try another node."""


class Proxy:
    def __init__(self, table: NodeTable):
        self.table = table

    async def send(self, node: Node, method: str, path: str, *, headers: dict[str, str] | None = None,
                   content: t.Any = None, params: t.Any = None,
                   timeout: t.Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Response:
        request = node.client.build_request(method, path, headers=headers, content=content, params=params,
                                            timeout=timeout)
        try:
            return await self._watched(node, node.client.send(request, stream=True))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            err = self.table.not_reached(node, None, exc)
            raise NotSent(err.status, err.code, err.message, err.extra) from None
        except httpx.TransportError as exc:  # may have reached the node: never retried
            raise no_answer(node, exc) from None

    async def _watched(self, node: Node, sending: t.Awaitable[T]) -> T:
        """``sending``, given up on when the node is lost while it waits for an answer.
        (These calls are rare next to the relayed ones: a task each costs nothing here.)"""
        task = asyncio.ensure_future(sending)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_SECONDS)
                if done:
                    return task.result()
                if self.table.lost(node):  # connected, but the node went silent: do not wait on it
                    task.cancel()
                    raise self.table.silent(node, None)
        except asyncio.CancelledError:
            task.cancel()
            raise
