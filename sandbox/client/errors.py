"""The client's exceptions: every failure the server reports, with the server's own words.

The server's message is what a user needs to read (why a sandbox is gone, which field was
wrong), so each exception carries it unchanged; a server that cannot be reached is a
`ServerUnavailable` whose message names the URL or socket tried and says how to start one.
"""

from __future__ import annotations

import typing as t

import httpx

START_HINT = ("start it with `sandbox-kernel serve` (or open a notebook with the sandbox kernel, which "
              "starts it), or give --url / SANDBOX_KERNEL_URL, or --state-dir / SANDBOX_KERNEL_STATE_DIR")


class ServerPlace(t.Protocol):
    """What an error message says of the server it could not reach or that refused it
    (``configuration.ServerConfig`` is one): where it is, and where the token came from."""

    @property
    def where(self) -> str: ...

    token_source: str


class SandboxError(Exception):
    """An error the server reported, or that kept the request from reaching it.

    `code` is the server's machine-readable code (`not_found`, `gone`, ...), `message` its
    human-readable explanation, `status` the HTTP status (None when there was no response),
    `details` the error's other fields (a 410's `state`, `reason`, `ended_at`; a 422's
    `exceeded`), as the server sent them.
    """

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details: dict[str, t.Any] = {}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class SandboxNotFound(SandboxError):
    """404: the server does not know this sandbox (or this file in it)."""


class SandboxGone(SandboxError):
    """410: the sandbox existed but ended; the message says whether it expired, was
    deleted, died (and of what) or was lost."""


class Unauthorized(SandboxError):
    """401: missing or wrong bearer token."""


class InvalidRequest(SandboxError):
    """400, 413, 415 or 422: the server refused the request as given."""


class ServerUnavailable(SandboxError):
    """The server could not be reached, did not answer in time, or said 503.

    `sent` is False when the request certainly never reached the server (the connection
    was refused), so that retrying it cannot run anything twice.
    """

    def __init__(self, code: str, message: str, status: int | None = None, *, sent: bool = True) -> None:
        super().__init__(code, message, status)
        self.sent = sent


_STATUS_ERRORS: dict[int, type[SandboxError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: SandboxNotFound,
    410: SandboxGone,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    503: ServerUnavailable,
}



def error_from_response(response: httpx.Response, config: ServerPlace) -> SandboxError:
    """Turn a non-2xx response into the matching exception, keeping the server's words."""
    code, message = "error", ""
    details: dict[str, t.Any] = {}
    try:
        body = response.json()
        err = body.get("error", {}) if isinstance(body, dict) else {}
        err = err if isinstance(err, dict) else {}
        code = err.get("code") or code
        message = err.get("message") or ""
        details = {k: v for k, v in err.items() if k not in ("code", "message")}
    except (ValueError, UnicodeDecodeError):
        message = response.text.strip()[:500]
    if not message:
        message = f"HTTP {response.status_code} {response.reason_phrase}"
    status = response.status_code
    cls = _STATUS_ERRORS.get(status)
    if cls is None:
        cls = ServerUnavailable if status >= 500 else SandboxError
    if cls is Unauthorized:
        message = f"the sandbox server at {config.where} refused the request: {message} (token: {config.token_source or 'none'})"
    if cls is ServerUnavailable:
        return ServerUnavailable(code, f"sandbox server at {config.where}: {message}", status, sent=True)
    error = cls(code, message, status)
    error.details = details
    return error


def transport_error(exc: httpx.TransportError, config: ServerPlace) -> ServerUnavailable:
    if isinstance(exc, httpx.ConnectError):
        return ServerUnavailable(
            "unreachable",
            f"cannot reach the sandbox server at {config.where} ({exc or 'connection refused'}): {START_HINT}",
            sent=False,
        )
    if isinstance(exc, httpx.ConnectTimeout):
        return ServerUnavailable(
            "unreachable", f"connecting to the sandbox server at {config.where} timed out: {START_HINT}", sent=False
        )
    if isinstance(exc, httpx.TimeoutException):
        return ServerUnavailable(
            "timeout", f"the sandbox server at {config.where} did not answer in time ({type(exc).__name__})"
        )
    return ServerUnavailable(
        "unreachable", f"lost the connection to the sandbox server at {config.where} ({type(exc).__name__}: {exc})"
    )

