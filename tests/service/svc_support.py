"""Helpers shared by the service integration tests (tests/service/).

Kept apart from the fixtures in tests/conftest.py: these are plain functions that read
events, speak raw HTTP where httpx would normalise a path, and look at host processes
under /proc.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import socket
import time
import typing as t
import urllib.parse

import httpx
import pytest

# ------------------------------------------------------------------ events


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def done_of(events: list[dict]) -> dict:
    assert events, "the execute answered no event at all"
    assert events[-1]["type"] == "done", events
    assert len(of_type(events, "done")) == 1, events
    return events[-1]


def stream_text(events: list[dict], name: str = "stdout") -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == name)


def result_text(events: list[dict]) -> str | None:
    results = of_type(events, "execute_result")
    return results[-1]["data"].get("text/plain") if results else None


def ok(events: list[dict]) -> list[dict]:
    """The events of a cell that must have succeeded (the failure message shows them)."""
    done = done_of(events)
    assert done["status"] == "ok", events
    assert not of_type(events, "error"), events
    return events


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


# --------------------------------------------------------------- host side


def sandbox_dir(server, sandbox_id: str) -> pathlib.Path:
    path = pathlib.Path(server.state_dir) / "sandboxes" / sandbox_id
    if not (path / "state.json").exists():
        pytest.skip(f"the server's state directory is not on this host ({path}): "
                    "SANDBOX_KERNEL_TEST_URL points at a server started elsewhere")
    return path


def supervisor_pid(server, sandbox_id: str) -> int:
    state = json.loads((sandbox_dir(server, sandbox_id) / "state.json").read_text())
    pid = state["supervisor_pid"]
    assert isinstance(pid, int) and pid > 1, state
    return pid


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, starttime) of a host process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def process_tree(root: int) -> dict[int, int]:
    """Every host pid (and thread id) under ``root``, itself included, with its start time."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append(int(name))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        st = _stat(pid)
        if st is None or pid in found:
            continue
        found[pid] = st[1]
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                tst = _stat(int(tid))
                if tst is not None:
                    found.setdefault(int(tid), tst[1])
        except FileNotFoundError:
            pass
        todo.extend(children.get(pid, []))
    return found


def still_running(pid: int, starttime: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == starttime


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [p.decode("utf-8", "replace") for p in f.read().split(b"\0") if p]
    except OSError:
        return []


def _status_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} line for pid {pid}")


def real_uid(pid: int) -> int:
    return int(_status_field(pid, "Uid").split()[0])


def thread_group(pid: int) -> int:
    """The process a thread id belongs to (itself for a process)."""
    return int(_status_field(pid, "Tgid"))


def wait_for(predicate: t.Callable[[], t.Any], timeout: float, interval: float = 0.1, what: str = "") -> t.Any:
    """Poll until ``predicate`` returns something true; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(interval)


def sandbox_for_module(server, **fields) -> t.Iterator[str]:
    """Body of a module-scoped fixture: one sandbox shared by tests that leave it usable
    (each create costs a cold start once the warm pool is drained)."""
    with httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {server.token}"}) as client:
        r = client.post("/v1/sandboxes", json=fields)
        assert r.status_code == 201, r.text
        sandbox_id = r.json()["id"]
        try:
            yield sandbox_id
        finally:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
