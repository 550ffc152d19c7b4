"""The connections a gateway keeps to one node for the calls it passes through: httpcore's
pool, without httpx's request and response models.

A passed-through call is bytes in, bytes out: the gateway does not read its body, follow
redirects, keep cookies or merge URLs, and on a trivial execute those layers cost as much
CPU as the rest of the gateway (py-spy: busy samples per execute halved without them).
So the path, headers and body go to httpcore as they are, with the node's token added.
"""

from __future__ import annotations

import typing as t

import httpcore
import httpx

# What a call that never got an answer raises (httpcore has no common base for them):
# connection refused or timed out (the request never left), or the connection failed later.
NOT_CONNECTED = (httpcore.ConnectError, httpcore.ConnectTimeout)
FAILED = (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError)
# A node that takes no bytes of an upload for this long is not taking it (httpx's default
# for the gateway's other calls too).
WRITE_TIMEOUT = 120.0


class Upstream:
    """One node's pool of keep-alive connections for passed-through calls."""

    def __init__(self, address: str, token: str, connect_timeout: float, *,
                 max_connections: int = 1000, max_keepalive: int = 200):
        url = httpx.URL(address)
        self.scheme = url.scheme.encode()
        self.host = url.host.encode()
        self.port = url.port
        self.host_header = url.netloc
        self.authorization = f"Bearer {token}".encode()
        self.connect_timeout = connect_timeout
        self.pool = httpcore.AsyncConnectionPool(max_connections=max_connections,
                                                 max_keepalive_connections=max_keepalive)

    async def open(self, method: str, target: bytes, headers: t.Iterable[tuple[bytes, bytes]],
                   content: bytes | t.AsyncIterable[bytes] | None, read_timeout: float | None) -> httpcore.Response:
        """Send the request; the answer's body is left to stream (``aiter_stream``) and the
        caller must ``aclose`` it."""
        sent = [(b"host", self.host_header), (b"authorization", self.authorization)]
        for name, value in headers:
            if name != b"content-length":
                sent.append((name, value))
        if isinstance(content, (bytes, bytearray)):
            sent.append((b"content-length", str(len(content)).encode()))
        elif content is not None:
            length = dict(headers).get(b"content-length")
            sent.append((b"content-length", length) if length is not None else (b"transfer-encoding", b"chunked"))
        request = httpcore.Request(
            method.encode(), httpcore.URL(scheme=self.scheme, host=self.host, port=self.port, target=target),
            headers=sent, content=content if content is not None else b"",
            extensions={"timeout": {"connect": self.connect_timeout, "read": read_timeout,
                                    "write": WRITE_TIMEOUT, "pool": self.connect_timeout}})
        return await self.pool.handle_async_request(request)

    async def aclose(self) -> None:
        await self.pool.aclose()
