"""Helpers of the service integration tests (tests/service/) alone: probe cells' JSON,
events stamped with their arrival, raw HTTP where httpx would normalise a path, and the
JSON error shape. What every suite needs lives in tests/support.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import typing as t
import urllib.parse

import httpx

from support import Server, create, ok, stream_text

# ------------------------------------------------------------------ events


def last_json_line(events: list[dict]) -> t.Any:
    """Probe cells print one JSON document as their last stdout line."""
    ok(events)
    lines = [line for line in stream_text(events).splitlines() if line.strip()]
    assert lines, events
    return json.loads(lines[-1])


def timed_execute(url: str, token: str, sandbox_id: str, code: str,
                  on_event: t.Callable[[float, dict], None] | None = None, **fields) -> list[tuple[float, dict]]:
    """Execute with its own client (safe in a thread); each event stamped with its arrival time."""
    out: list[tuple[float, dict]] = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=120),
                      headers={"Authorization": f"Bearer {token}"}) as client:
        with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields}) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("application/x-ndjson")
            for line in r.iter_lines():
                if not line:
                    continue
                stamped = (time.monotonic(), json.loads(line))
                out.append(stamped)
                if on_event is not None:
                    on_event(*stamped)
    return out


# ------------------------------------------------------------------ errors


def api_error(response: httpx.Response | "RawResponse", status: int) -> dict:
    """The ``error`` object of a JSON error answer with exactly this status."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"], body
    assert isinstance(error.get("message"), str) and error["message"], body
    return error


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status_code = status
        self.headers = headers
        self.content = body

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> t.Any:
        return json.loads(self.content)


def raw_request(url: str, method: str, path: str, token: str | None = None, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30) -> RawResponse:
    """Send ``path`` byte for byte (httpx would resolve ``..`` segments before sending)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        data = response.read()
        return RawResponse(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


def declared_too_large(url: str, path: str, token: str, declared: int, sent: bytes) -> RawResponse:
    """A request whose Content-Length promises more than it sends: the answer must not wait for it."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        head = (f"PUT {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {declared}\r\nConnection: close\r\n\r\n").encode()
        s.sendall(head + sent)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head_part, _, rest = data.partition(b"\r\n\r\n")
        lines = head_part.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return RawResponse(status, headers, rest[:length])


# --------------------------------------------------------------- sandboxes


def sandbox_for_module(server: Server, **fields) -> t.Iterator[str]:
    """Body of a module-scoped fixture: one sandbox shared by tests that leave it usable
    (each create costs a cold start once the warm pool is drained)."""
    with server.client(timeout=120) as client:
        sandbox_id = create(client, **fields)["id"]
        try:
            yield sandbox_id
        finally:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
