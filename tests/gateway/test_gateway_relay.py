"""The gateway's relay at the byte level, against a real node on loopback: requests on one
kept-alive connection (sent one after another, and pipelined in one write) are answered in
order, a request head it cannot read is answered 400 with a JSON body, and its own answers
to calls it does not pass on are the node's (token, method, size, id)."""

from __future__ import annotations

import json
import socket

import httptools
import pytest

import support

pytestmark = pytest.mark.timeout(300)


class Answers:
    """The HTTP answers read off one raw connection, in order (httptools' parser)."""

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, dict[str, str], bytes]] = []
        self.headers: dict[str, str] = {}
        self.body = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self.headers, self.body))
        self.headers, self.body = {}, b""

    def read(self, sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
        """``count`` more answers, or whatever came before the connection closed."""
        want = len(self.done) + count
        while len(self.done) < want:
            data = sock.recv(65536)
            if not data:
                break
            self.parser.feed_data(data)
        return self.done[want - count:]


def _request(method: str, path: str, token: str, body: dict | None = None, extra: str = "") -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n{extra}"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    return head.encode() + b"\r\n" + payload


def _events(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.splitlines() if line]


@pytest.fixture
def raw(gateway):
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=60)
    yield sock
    sock.close()


@pytest.fixture
def sandbox_id(gateway):
    with gateway.client() as c:
        sandbox_id = support.create(c)["id"]
        yield sandbox_id
        c.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.mark.slow
def test_one_connection_serves_requests_one_after_another_and_pipelined(gateway, raw, sandbox_id):
    token, answers = gateway.token, Answers()
    execute = f"/v1/sandboxes/{sandbox_id}/execute"
    # Kept alive: one request, its answer, then the next on the same connection.
    raw.sendall(_request("POST", execute, token, {"code": "n = 1\nprint('first')"}))
    [(status, headers, body)] = answers.read(raw, 1)
    assert status == 200 and headers["content-type"].startswith("application/x-ndjson")
    assert support.stream_text(support.ok(_events(body))) == "first\n"
    raw.sendall(_request("GET", f"/v1/sandboxes/{sandbox_id}", token))
    [(status, _, body)] = answers.read(raw, 1)
    assert status == 200 and json.loads(body)["id"] == sandbox_id
    # Pipelined: five requests in one write, to the node, to the gateway's app and answered
    # by the relay itself; the answers come back in the order of the requests.
    raw.sendall(_request("POST", execute, token, {"code": "import time; time.sleep(0.5); n += 1; print(n)"})
                + _request("GET", "/v1/nodes", token)
                + _request("GET", f"/v1/sandboxes/{sandbox_id}", "wrong")
                + _request("POST", execute, token, {"code": "n += 1; print(n)"})
                + _request("GET", f"/v1/sandboxes/{sandbox_id}/files", token))
    first, nodes, refused, second, files = answers.read(raw, 5)
    assert first[0] == 200 and support.stream_text(support.ok(_events(first[2]))) == "2\n"
    assert nodes[0] == 200 and [n["node_id"] for n in json.loads(nodes[2])["nodes"]] == ["loop1"]
    assert refused[0] == 401 and json.loads(refused[2])["error"]["code"] == "unauthorized"
    assert second[0] == 200 and support.stream_text(support.ok(_events(second[2]))) == "3\n"
    assert files[0] == 200 and "files" in json.loads(files[2])
    # Still open, still in step.
    raw.sendall(_request("GET", "/v1/health", token))
    [(status, _, _)] = answers.read(raw, 1)
    assert status == 200


def test_a_head_request_is_answered_and_the_connection_goes_on(gateway, raw):
    """HEAD on the gateway's own routes: the head of the GET answer, no body, and the next
    request on the same connection is answered (the relay does not wait for a body)."""
    answers = Answers()
    raw.sendall(_request("HEAD", "/v1/health", gateway.token))
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(65536)
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n"), head  # no body after it
    raw.sendall(_request("GET", "/v1/health", gateway.token))
    [(status, _, body)] = answers.read(raw, 1)
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.parametrize("head", [
    b"GET /v1/sandboxes/x HTTP/1.1\r\nHost: gw\r\nno colon here\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 (a TLS hello)\r\n\r\n",
    b"GET /v1/sandboxes/x HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
], ids=["bad header line", "not http", "head too large"])
def test_a_request_head_the_relay_cannot_read_is_answered_400_json(raw, head):
    raw.sendall(head)
    answers = Answers()
    [(status, headers, body)] = answers.read(raw, 1)
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "invalid_request", body
    assert headers["connection"] == "close" and raw.recv(1) == b""  # where a next request would start is unknown


@pytest.mark.slow
def test_the_relays_own_answers_are_the_nodes(gateway, node, sandbox_id):
    """What the relay answers without the node (token, method, body size, id form) reads as
    the node's own answer would."""
    import httpx

    for base in (gateway.url, node.url):
        r = httpx.get(f"{base}/v1/sandboxes/{sandbox_id}", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["message"].startswith("wrong bearer token"), r.text
    with gateway.client() as g, node.client() as n:
        a, b = g.patch(f"/v1/sandboxes/{sandbox_id}"), n.patch(f"/v1/sandboxes/{sandbox_id}")
        assert (a.status_code, a.json()) == (b.status_code, b.json()) == (405, b.json())
        big = {"code": "x" * (2 * 1024 * 1024)}
        a, b = g.post(f"/v1/sandboxes/{sandbox_id}/execute", json=big), n.post(f"/v1/sandboxes/{sandbox_id}/execute", json=big)
        assert (a.status_code, a.json()) == (b.status_code, b.json()) == (413, b.json())
        r = g.get("/v1/sandboxes/sbx-0123456789abcdef/files")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
