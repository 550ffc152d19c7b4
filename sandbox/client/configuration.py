"""Where the server is, how to authenticate to it, and how long to wait for it.

Which server: the one of the state directory (its unix socket), unless a URL is given; the
rule is sandbox/service/endpoint.py's, shared with the kernel and the command line.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field

import httpx

from ..service import endpoint as _endpoint
from ..common.paths import default_state_dir as _default_state_dir
from .errors import InvalidRequest

# Most calls are quick bookkeeping on the server: a short read timeout turns a wedged
# server into an error instead of a hang. Connect is shorter still: on loopback a
# refused or silent port is known at once.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# Create may boot a sandbox when the warm pool is empty (a second or so) or build a
# custom image first (minutes).
CREATE_READ_TIMEOUT = 600.0


def default_state_dir() -> pathlib.Path:
    """The server's state directory: the server's own rule (sandbox/common/paths.py)."""
    return pathlib.Path(_default_state_dir())


@dataclass(frozen=True)
class ServerConfig:
    """Where the server is and how to authenticate to it.

    `url` is what the user sees (``unix:/path/server.sock`` or ``http://host:port``);
    `socket` is set for a unix socket, where the server knows the caller by its uid and no
    token is needed. `token_source` records where the token came from (or where it was
    looked for), so that a 401 can tell the user what to fix.
    """

    url: str = ""
    token: str | None = field(default=None, repr=False)
    state_dir: pathlib.Path = field(default_factory=default_state_dir)
    token_source: str = ""
    socket: str | None = None
    #: ``Sandbox-Scope`` sent with every request (``own[, others]``): the server labels what
    #: this client creates with ``own`` and answers only for sandboxes of these scopes.
    scope: str | None = None

    @property
    def endpoint(self) -> _endpoint.Endpoint:
        return _endpoint.Endpoint(self.url, self.socket)

    @property
    def where(self) -> str:
        """The URL or socket, for messages."""
        return self.endpoint.describe()

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "sandbox-kernel-client"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.scope:
            headers["Sandbox-Scope"] = self.scope
        return headers


def resolve(
    url: str | None = None, token: str | None = None, state_dir: str | os.PathLike | None = None
) -> ServerConfig:
    """Find the server and the token: arguments, then the environment, then the state
    directory (sandbox/service/endpoint.py has the order).

    Over a unix socket no token is needed (the server checks the caller's uid); a token
    given explicitly is still sent. Over TCP the token file is read last because it only
    exists on the server's own machine. Raises `InvalidRequest` for a malformed URL.
    """
    try:
        where = _endpoint.find(url, state_dir)
    except _endpoint.EndpointError as exc:
        raise InvalidRequest("invalid_url", str(exc)) from None
    sdir = pathlib.Path(state_dir).expanduser().absolute() if state_dir else default_state_dir()
    if where.socket and os.path.dirname(where.socket) != str(sdir):
        sdir = pathlib.Path(os.path.dirname(where.socket))

    def config(tok: str | None, source: str) -> ServerConfig:
        return ServerConfig(where.url, tok, sdir, source, where.socket)

    if token:
        return config(token, "argument")
    env_token = os.environ.get("SANDBOX_KERNEL_TOKEN", "").strip()
    if env_token:
        return config(env_token, "SANDBOX_KERNEL_TOKEN")
    if where.socket:
        return config(None, "not needed: unix socket (the server checks the caller's uid)")
    token_file = sdir / "token"
    try:
        file_token = token_file.read_text().strip()
    except FileNotFoundError:
        return config(None, f"none: SANDBOX_KERNEL_TOKEN is unset and {token_file} does not exist")
    except OSError as exc:
        return config(None, f"none: SANDBOX_KERNEL_TOKEN is unset and {token_file} is unreadable ({exc.strerror})")
    return config(file_token or None, str(token_file))



def execute_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # A cell may print nothing for hours; its own timeout is the server's business.
    return httpx.Timeout(connect=timeout.connect, read=None, write=timeout.write, pool=timeout.pool)


def transfer_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    # The server may pause while writing a large file to disk.
    read = None if timeout.read is None else max(timeout.read, 120.0)
    return httpx.Timeout(connect=timeout.connect, read=read, write=None, pool=timeout.pool)


def as_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    if timeout is None:
        return DEFAULT_TIMEOUT
    return httpx.Timeout(timeout, connect=min(5.0, timeout))


def create_timeout(timeout: httpx.Timeout) -> httpx.Timeout:
    read = None if timeout.read is None else max(timeout.read, CREATE_READ_TIMEOUT)
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)

