"""Who calls the gateway, and what that changes on the way to a node.

Two kinds of bearer token are accepted, in the relay (calls on one sandbox) and in the app
(everything else) alike:

- the shared token (``token``): the administrator's, as before; it reaches every sandbox,
  the node routes, usage and metrics, and passes the client's Sandbox-Scope on unchanged;
- a user token (sandbox/gateway/users.py), when ``user_secret`` is set: the gateway sends
  the user's scope to the node in place of the client's, so the node itself refuses another
  user's sandboxes as unknown ids; the administrator's routes answer 403.

Anything else is 401 with the node server's message (``auth.check_bearer``).
"""

from __future__ import annotations

import typing as t

from ..common.errors import ApiError
from ..service import scopes
from ..service.auth import Auth, Caller, check_bearer
from . import users

USER_KEY = "gateway_user"
BEARER = b"Bearer "
# Routes for the shared token only: the nodes, their drain, everyone's usage, the metrics.
ADMIN_ONLY = ("/v1/nodes", "/v1/usage", "/metrics")


def identify(authorization: bytes, expected: bytes, user_secret: str) -> str | None:
    """The user a request's ``Authorization`` value speaks for, None for the shared token's
    holder; 401 for anything else (a forged token, one made with another secret)."""
    if user_secret and authorization.startswith(BEARER + users.PREFIX.encode()):
        name = users.verify(user_secret, authorization[len(BEARER):].decode("latin-1"))
        if name is not None:
            return name
    check_bearer(authorization, expected)
    return None


def user_scope(user: str, declared: str | None) -> str:
    """The Sandbox-Scope a node gets for ``user``: their own label and family when the client
    declared none; the client's scope and reach inside the user's family when it did (``*``
    becomes all of the user's sandboxes, never every sandbox)."""
    asked = scopes.parse(declared)
    base = users.label(user)
    if asked.own is None:
        names = [base, base + scopes.FAMILY]
    else:
        names = [f"{base}:{asked.own}"]
        for reach in sorted(asked.reach):
            names += [base, base + scopes.FAMILY] if reach == scopes.ANY else [f"{base}:{reach}"]
    value = ", ".join(names)
    try:
        scopes.parse(value)
    except ApiError:
        raise ApiError(400, "invalid_request", f"Sandbox-Scope {declared!r} is too long for user {user!r}: the user's "
                                               f"label ({base}) and a scope name together have at most 64 "
                                               "characters") from None
    return value


def admin_only(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ADMIN_ONLY)


def refuse_admin_route(path: str) -> None:
    if admin_only(path):
        raise ApiError(403, "forbidden", f"{path} is the administrator's (the gateway's shared token); "
                                         "a user token reaches its own sandboxes and images only")


class GatewayAuth(Auth):
    """The node server's token middleware, taking user tokens too: the caller's user (or
    None) goes into the request's state for ``forwarded_scope``."""

    def __init__(self, app: t.Any, token: str, user_secret: str = "") -> None:
        super().__init__(app, token)
        self.user_secret = user_secret

    def _identify(self, scope: dict) -> Caller:
        user = identify(dict(scope["headers"]).get(b"authorization", b""), self.expected, self.user_secret)
        if user is not None:
            refuse_admin_route(scope["path"])
        scope.setdefault("state", {})[USER_KEY] = user
        return Caller(None)


def user_of(request: t.Any) -> str | None:
    return request.scope.get("state", {}).get(USER_KEY)


def forwarded_scope(request: t.Any) -> dict[str, str]:
    """The Sandbox-Scope header a node gets for this request: the user's for a user token,
    the client's own (if any) for the shared token."""
    declared = request.headers.get(scopes.HEADER)
    user = user_of(request)
    if user is not None:
        return {scopes.HEADER: user_scope(user, declared)}
    return {scopes.HEADER: declared} if declared is not None else {}
