"""Where a sandbox server listens, and how a client reaches it: one rule for the kernel, the
Python client and every CLI command.

A server always listens on the unix socket of its state directory (``STATE/server.sock``,
mode 0600), and on TCP only when asked (``serve --port``/``--host``). A client that knows a
state directory therefore reaches that directory's server and no other: two users, or two
state directories of one user, never meet, and the socket's file permissions are the
authentication (the server also checks the caller's uid, see sandbox/service/auth.py).

The order, the same everywhere:

1. an explicit URL: an argument (``--url``), else ``SANDBOX_KERNEL_URL`` when no state
   directory was given explicitly;
2. the state directory: an argument (``--state-dir``), else ``SANDBOX_KERNEL_STATE_DIR``,
   else the default (``/var/lib/sandbox-kernel`` for root, ``~/.local/share/sandbox-kernel``
   otherwise): its socket;
3. with nothing of the above set, for an ordinary user whose own server is not running:
   the host's system server, when one runs (root's ``serve --multi-user``: a socket owned by
   root and open to every user, in ``system_state_dir()``). It ties each request to its
   caller's uid, so this reaches the user's own sandboxes there and nobody else's; a kernel
   and a command find it alike (a JupyterHub's kernelspecs name it in rule 1 anyway).

URLs are ``http://HOST:PORT`` (TCP, with the bearer token) or ``unix:/path/to/server.sock``.
Nothing else falls back from one server to another: an unreachable endpoint is an error
that names it.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import pathlib
import typing as t
from dataclasses import dataclass

import httpx

from ..common.paths import SOCKET_NAME, reached_state_dir

if t.TYPE_CHECKING:
    import ssl

UNIX_SCHEME = "unix:"
# What httpx puts in the Host header over a unix socket: any name will do, none is resolved.
SOCKET_BASE_URL = "http://sandbox-kernel"
# sockaddr_un's sun_path holds 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107


class EndpointError(ValueError):
    """A URL or socket path that cannot name a server; the message says why."""


@dataclass(frozen=True)
class Endpoint:
    """A server's address: a unix socket path, or a TCP base URL."""

    url: str
    socket: str | None = None

    @property
    def base_url(self) -> str:
        """The base URL for httpx requests."""
        return SOCKET_BASE_URL if self.socket else self.url

    def describe(self) -> str:
        """For messages: what was tried, so the user can tell which server it was."""
        return f"unix socket {self.socket}" if self.socket else self.url

    @property
    def tls(self) -> bool:
        """Whether requests to it go over TLS (an https:// URL)."""
        return not self.socket and self.url.startswith("https://")

    # httpx gives a transport an SSL context of its own unless it is handed one. Over a unix
    # socket or to an http:// URL there is no TLS, and each such context cost a kernel
    # process about 4 MiB of its own memory (OpenSSL's set-up in the process, and the CA
    # bundle); these transports share one instead (`plain_http_context`). An https:// URL
    # gets httpx's own, verifying with its CA bundle.
    def transport(self) -> httpx.HTTPTransport | None:
        return None if self.tls else httpx.HTTPTransport(uds=self.socket, verify=plain_http_context())

    def async_transport(self) -> httpx.AsyncHTTPTransport | None:
        return None if self.tls else httpx.AsyncHTTPTransport(uds=self.socket, verify=plain_http_context())


@functools.cache
def plain_http_context() -> ssl.SSLContext:
    """The one SSL context of this process's transports that speak plain HTTP (a unix
    socket, an http:// URL): httpx wants one per transport, and none of them makes a TLS
    connection. It is the standard library's default client context (it verifies against
    the system's CAs, were it ever used), made once: the first context in a process sets up
    OpenSSL's tables there, several MiB of its own memory. A kernel's fork server makes it
    before it forks (kernel/forkserver.py), so that the kernel processes share those pages."""
    import ssl

    return ssl.create_default_context()


def is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unix(path: str | os.PathLike) -> Endpoint:
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise EndpointError(
            f"the socket path {path} is longer than the {MAX_SOCKET_PATH} bytes a unix socket address holds; "
            "choose a shorter state directory"
        )
    return Endpoint(UNIX_SCHEME + path, path)


def parse_url(url: str) -> Endpoint:
    """``unix:/path``, ``unix:///path`` or ``http(s)://host[:port]``."""
    url = url.strip()
    if url.startswith(UNIX_SCHEME):
        path = url[len(UNIX_SCHEME):]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise EndpointError(f"{url!r}: a unix socket URL needs an absolute path, e.g. unix:/run/sandbox-kernel/server.sock")
        return unix(path)
    parts = httpx.URL(url)
    if parts.scheme not in ("http", "https") or not parts.host:
        raise EndpointError(f"{url!r} is not a server URL: use http://HOST:PORT or unix:/path/to/server.sock")
    return Endpoint(url.rstrip("/"))


def of_state_dir(state_dir: str | os.PathLike) -> Endpoint:
    """The socket of a state directory's server."""
    return unix(pathlib.Path(state_dir).expanduser().absolute() / SOCKET_NAME)


def find(url: str | None = None, state_dir: str | os.PathLike | None = None) -> Endpoint:
    """The endpoint by the order in the module docstring."""
    if url:
        return parse_url(url)
    if state_dir:
        return of_state_dir(state_dir)
    env_url = os.environ.get("SANDBOX_KERNEL_URL", "").strip()
    if env_url:
        return parse_url(env_url)
    return of_state_dir(reached_state_dir())
