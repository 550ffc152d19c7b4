"""Who is calling: the peer's uid on the unix socket, the bearer token on TCP.

On the unix socket the kernel tells us the caller's pid, uid and gid (SO_PEERCRED): it
cannot be forged, needs no secret, and is what ties a request to a user on a shared host.
uvicorn does not put it in the ASGI scope, so the HTTP protocol class is wrapped to read it
once per connection and hand it on through the connection's ``state`` (which uvicorn copies
into every request's ``scope["state"]``, where Starlette's ``request.state`` reads it).

Who may do what (``Caller``):

- per-user server (the embedded default): its socket is 0600, so only its owner (and root)
  can connect; a caller of any other uid is refused.
- system-wide server (``serve --multi-user``, as root): the socket is 0666 and every uid may
  connect; a caller who is not root is a *tenant* that sees only its own sandboxes.
- TCP: the bearer token, compared in constant time; a token holder sees every sandbox.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
import typing as t
from dataclasses import dataclass

from starlette.responses import JSONResponse

from ..common.errors import ApiError

PEER_KEY = "peer"
CALLER_KEY = "caller"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class Caller:
    """The authenticated caller. ``tenant`` is the uid whose sandboxes alone it may see, or
    None for the server's owner, root, or a token holder (who see all). ``peer`` is set on
    the unix socket (its pid is what `end_with_caller` watches)."""

    tenant: int | None
    peer: Peer | None = None

    def may_see(self, owner: int | None) -> bool:
        return self.tenant is None or owner == self.tenant

    @property
    def label(self) -> str:
        return f"uid {self.tenant}" if self.tenant is not None else "the server's owner"


def peer_of(sock: socket.socket | None) -> Peer | None:
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


def with_peer_credentials(protocol_class: type) -> type:
    """A subclass of uvicorn's HTTP protocol class that records the peer of each unix-socket
    connection in the state every request of that connection sees."""

    class PeerCredentialsProtocol(protocol_class):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: t.Any) -> None:
            peer = peer_of(transport.get_extra_info("socket"))
            if peer is not None:
                self.app_state = {**self.app_state, PEER_KEY: peer}
            super().connection_made(transport)

    PeerCredentialsProtocol.__name__ = f"PeerCredentials{protocol_class.__name__}"
    return PeerCredentialsProtocol


def caller_of(request: t.Any) -> Caller:
    """The caller of a Starlette request (set by `Auth`)."""
    return request.scope.get("state", {}).get(CALLER_KEY) or Caller(None)


def check_bearer(given: bytes, expected: bytes) -> None:
    """The token rule on TCP (the node server's and the gateway's relay): the whole
    ``Authorization`` value, compared in constant time, or a 401 that says what to send."""
    if not hmac.compare_digest(given, expected):
        message = "missing bearer token" if not given else "wrong bearer token"
        raise ApiError(401, "unauthorized", f"{message}: send 'Authorization: Bearer <token>' "
                                            "(the token is in SANDBOX_KERNEL_TOKEN or the state directory's token file)")


class Auth:
    """ASGI middleware: decide who the caller is, or answer 401/403 (health and the node proof are open)."""

    OPEN_PATHS = {"/v1/health", "/v1/node/proof"}

    METRICS_PATH = "/metrics"

    def __init__(self, app: t.Any, token: str, multi_user: bool = False, owner_uid: int | None = None,
                 scrape_port: int = 0) -> None:
        """``scrape_port``: the loopback port (metrics_port) where /metrics, and only it, is open."""
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.multi_user = multi_user
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        self.scrape_port = scrape_port

    def _is_open(self, scope: dict) -> bool:
        if scope["path"] in self.OPEN_PATHS:
            return True
        server = scope.get("server") or ()
        return bool(self.scrape_port) and scope["path"] == self.METRICS_PATH and len(server) == 2 \
            and server[1] == self.scrape_port

    def _identify(self, scope: dict) -> Caller:
        peer: Peer | None = scope.get("state", {}).get(PEER_KEY)
        if peer is not None:
            if peer.uid in (0, self.owner_uid):
                return Caller(None, peer)
            if self.multi_user:
                return Caller(peer.uid, peer)
            raise ApiError(403, "forbidden", f"this sandbox server belongs to uid {self.owner_uid}; uid {peer.uid} "
                                             "may not use it (start your own: each user's kernel starts one in "
                                             "their own state directory)")
        check_bearer(dict(scope["headers"]).get(b"authorization", b""), self.expected)
        return Caller(None)

    async def __call__(self, scope: dict, receive: t.Any, send: t.Any) -> None:
        if scope["type"] == "http":
            try:
                caller = Caller(None) if self._is_open(scope) else self._identify(scope)
            except ApiError as exc:
                response = JSONResponse(exc.body(), status_code=exc.status)
                if exc.status == 401:
                    response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})[CALLER_KEY] = caller
        await self.app(scope, receive, send)
