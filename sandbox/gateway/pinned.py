"""An HTTP client for one candidate node that connects only to the address it was found at.

A plain client resolves the URL's host name again for every new connection, so the address
that proved it is the node (``identity.prove``) need not be the one the next request, with
the node token, reaches: a name with two records, one a node and one a relay, would pass the
proof at one and hand the token to the other. Here the connection is made to the target's IP
whatever the URL's host is; the request keeps the URL, so its Host header and its TLS server
name stay the node's name. No proxy from the environment either: a request that went through
one would reach the node from somewhere the proof knows nothing of.
"""

from __future__ import annotations

import typing as t

import httpcore
import httpx

from .discovery import Target


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own network backend, with every TCP connection sent to one IP address."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: t.Iterable[t.Any] | None = None) -> httpcore.AsyncNetworkStream:
        return await self.inner.connect_tcp(self.ip, port, timeout=timeout, local_address=local_address,
                                            socket_options=socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: t.Iterable[t.Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a node is reached over TCP at its proven address only")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport (its request and error mapping) over a pool that uses ``PinnedBackend``."""

    def __init__(self, ip: str, limits: httpx.Limits) -> None:
        super().__init__(limits=limits, trust_env=False)
        # The one attribute httpx keeps its pool in; the pool is built as httpx builds it,
        # with the network backend httpx does not let a caller choose.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=PinnedBackend(ip))


def pinned_client(target: Target, *, timeout: httpx.Timeout, limits: httpx.Limits,
                  auth: httpx.Auth | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=target.url, timeout=timeout, auth=auth, trust_env=False,
                             transport=PinnedTransport(target.ip, limits))
