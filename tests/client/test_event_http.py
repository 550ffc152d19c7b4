"""The event streams' own HTTP/1.1 path (sandbox/client/event_http.py): kept connections on
the real server, in both client flavours, and its parsing on its own."""

from __future__ import annotations

import select
import socket
import time

import pytest

from sandbox.client import ServerConfig
from sandbox.client.event_http import Head, LineSplitter, lean_path


@pytest.fixture
def sbx(sandbox_server, client):
    with client.Sandbox.create(url=sandbox_server.url, token=sandbox_server.token) as s:
        yield s


def _raw_socket(conn):
    return conn.sock if hasattr(conn, "sock") else conn.writer.get_extra_info("socket")


def _peer_closed(sock) -> bool:
    readable, _, _ = select.select([sock.fileno()], [], [], 0)
    return bool(readable)


def test_cells_reuse_one_kept_connection(sbx):
    events = sbx._transport.events
    assert events is not None, "a loopback server is reached without httpx"
    assert sbx.run_code("x = 1").error is None
    assert len(events.idle) == 1
    kept = events.idle[0]
    assert sbx.run_code("x += 1").error is None
    assert events.idle == [kept]
    assert sbx.run_code("print(x)").stdout == "2\n"


def test_a_connection_the_server_closed_is_not_reused(sbx):
    events = sbx._transport.events
    assert sbx.run_code("x = 1").error is None
    kept = events.idle[0]
    # Our end says it is done writing; the server then closes its end, as it does with an
    # idle connection past its keep-alive time.
    sock = _raw_socket(kept)
    sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + 60
    while not _peer_closed(sock):
        assert time.monotonic() < deadline, "the server never closed the connection"
        time.sleep(0.05)
    assert sbx.run_code("print(x)").stdout == "1\n"
    assert events.idle and events.idle[0] is not kept


def test_lines_are_whole_across_chunks():
    split = LineSplitter()
    assert split.feed(b'{"a": 1}\n{"b"') == ['{"a": 1}']
    assert split.feed(b': "\xc3') == []
    assert split.feed(b'\xa9"}\n{"c": 3}\n') == ['{"b": "\u00e9"}', '{"c": 3}']
    assert split.feed(b'{"d"') == [] and split.end() == ['{"d"']


@pytest.mark.parametrize("head, keep", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", True),
    (b"HTTP/1.1 404 Not Found\r\ncontent-length: 12\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\n\r\n", False),  # read to the end: the end closes it
    (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", False),
])
def test_a_connection_is_kept_only_when_the_answer_says_where_it_ends(head, keep):
    assert Head.parse(head).keep_alive is keep


def test_https_and_a_proxy_from_the_environment_stay_with_httpx(monkeypatch):
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert lean_path(ServerConfig(url="https://sandboxes.example:8000")) is None
    assert lean_path(ServerConfig(url="unix:/run/s.sock", socket="/run/s.sock"))[0] == "/run/s.sock"
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert lean_path(ServerConfig(url="http://sandboxes.example:8000")) is None
    assert lean_path(ServerConfig(url="http://127.0.0.1:8000/base")) == (None, "127.0.0.1", 8000, "/base")
