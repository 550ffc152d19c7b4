"""Red team on the gateway's node identity: a second address on loopback answers as the node
``loop1`` (the issue's takeover). Three impostors: one that only claims the id, one that
relays the proof challenge to the real node, and one that holds the node token itself. None
receives the token or a call (the relayed proof names the real node's address; the token
holder's claim is a duplicate, refused and reported), and every call goes to the real node.
Control: the same recording server with an id of its own and the token does prove itself and
does receive the token, so the probe sees a token when one is sent.

And a relay at a second address of the node's host name (a DNS server the test runs gives the
name 127.0.0.1 and 127.0.0.2): a candidate node of its own, refused, never sent the token;
control, the check loosened back to any address of the name."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import types
import urllib.parse

import httpx
import pytest

import support
from dns_zone import Zone
from node_proof_probe import Recording, loosened_gateway
from sandbox.service import nodeproof


class Impostor:
    """An HTTP server on loopback that answers as a node and records what it is sent."""

    def __init__(self, mode: str, node: support.Server, node_id: str = "loop1") -> None:
        self.mode, self.node, self.node_id = mode, node, node_id
        self.seen: list[tuple[str, str]] = []  # (path, Authorization header)
        # It answers 503 until opened: the test opens it once the real node holds its id, so
        # that the impostor is the late claimant whatever the order the gateway asks them in.
        self.opened = threading.Event()
        impostor = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                impostor.seen.append((self.path, self.headers.get("authorization") or ""))
                status, body = impostor.answer(self.path)
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> tuple[int, dict]:
        if not self.opened.is_set():
            return 503, {"error": {"code": "unavailable", "message": "not yet"}}
        parts = urllib.parse.urlsplit(path)
        if parts.path == "/v1/node/proof":
            challenge = urllib.parse.parse_qs(parts.query)["challenge"][0]
            if self.mode == "relay":  # the real node's own answer, passed on
                return 200, httpx.get(f"{self.node.url}{path}", timeout=10).json()
            address = nodeproof.address_text("127.0.0.1", self.server.server_address[1])
            token = self.node.token if self.mode == "token" else "a-guess"
            return 200, {"node_id": self.node_id, "address": address,
                         "proof": nodeproof.proof(token, challenge, self.node_id, address)}
        if parts.path == "/v1/info":
            return 200, {"node_id": self.node_id, "draining": False, "version": "0",
                         "capacity": {"sandboxes": {"free": 100}}, "pool": {}}
        return 200, {"id": "sbx-loop1-taken", "state": "running"}

    def tokens_seen(self) -> list[str]:
        return [auth for _, auth in self.seen if self.node.token in auth]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answered(summary: dict) -> bool:
    """Refused for what the impostor answered once opened, not for its 503 before."""
    return bool(summary["error"]) and "HTTP 503" not in summary["error"]


def summaries(gw) -> dict[str, dict]:
    with gw.client() as c:
        return {n["address"]: n for n in c.get("/v1/nodes").json()["nodes"]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["claim", "relay", "token", "control-own-id"])
def test_an_impostor_never_gets_the_token_nor_a_call(node, mode, new_gateway):
    impostor = Impostor("token" if mode == "control-own-id" else mode, node,
                        node_id="loop9" if mode == "control-own-id" else "loop1")
    gw = new_gateway(f"impostor-{mode}", "--node", impostor.url, "--refresh-seconds", "0.3")
    try:
        assert support.wait_for(lambda: summaries(gw).get(node.url, {}).get("state") == "up", 60), summaries(gw)
        impostor.opened.set()
        seen = support.wait_for(lambda: (lambda s: s if len(s) == 2 and s[node.url]["state"] == "up"
                                         and (answered(s[impostor.url]) or s[impostor.url]["state"] == "up") else None)(
            summaries(gw)), 30)
        if mode == "control-own-id":  # a node of its own: it proves itself and gets the token
            assert seen[impostor.url]["state"] == "up" and impostor.tokens_seen(), seen
            return
        refused = seen[impostor.url]
        assert refused["state"] == "down" and refused["node_id"] is None, refused
        expected = {"claim": "does not match the node token", "relay": "it proved to be reached at",
                    "token": "duplicate node id"}[mode]
        assert expected in refused["error"], refused
        with gw.client(timeout=httpx.Timeout(300, connect=5)) as c:  # a create on a loaded host
            created = c.post("/v1/sandboxes", json={})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            try:
                support.ok(support.execute(c, sid, "x = 41"))
                assert "42" in support.stream_text(support.ok(support.execute(c, sid, "print(x + 1)")))
                assert c.delete(f"/v1/sandboxes/{sid}").status_code == 200
            finally:
                with node.client() as direct:
                    direct.delete(f"/v1/sandboxes/{sid}")
        assert impostor.tokens_seen() == []
        assert {path.partition("?")[0] for path, _ in impostor.seen} <= {"/v1/node/proof"}, impostor.seen
        assert mode != "token" or "refused: " + impostor.url in gw.log_path.read_text()
    finally:
        impostor.close()


NAME = "loop1.proof.test"
PROBE = support.REPO / "tests" / "node_proof_probe.py"


@pytest.fixture
def relay_on_a_second_address(node, tmp_path):
    """The probe's relay on 127.0.0.2 at the node's port, passing everything on to the node
    (127.0.0.1), and a DNS server that gives the node's host name both addresses."""
    port = httpx.URL(node.url).port
    record = tmp_path / "relay.jsonl"
    with open(tmp_path / "relay.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, str(PROBE), "127.0.0.2", str(port), node.url, str(record)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    zone = Zone()
    try:
        assert support.wait_for(lambda: _listening("127.0.0.2", port), 20), (tmp_path / "relay.log").read_text()
        yield types.SimpleNamespace(recording=Recording(record), zone=zone, url=f"http://{NAME}:{port}",
                                    node_peer=f"127.0.0.1:{port}", relay_peer=f"127.0.0.2:{port}")
    finally:
        zone.close()
        proc.kill()
        proc.wait(10)


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("check", ["exact-peer", "control-any-address-of-the-name"])
def test_a_relay_at_another_address_of_the_nodes_name_never_gets_the_token(node, gateway_to, relay_on_a_second_address,
                                                                           check):
    """``--node http://NAME:PORT`` where NAME has two addresses: the node's and a relay's. Each
    is a candidate node; the relay's passes on the real node's proof, which names the real
    node's address, and is refused; it never sees the token. Control: with the check loosened
    back to any address of the name, the relay, asked first, gets the token."""
    relay = relay_on_a_second_address
    relay.zone.records[NAME] = ["127.0.0.2"]  # asked first: the name's only address when the gateway starts
    args = ("--node", relay.url, "--dns-server", relay.zone.server_arg, "--refresh-seconds", "0.3")
    if check.startswith("control"):
        gw = gateway_to(node.token, *args, launcher=loosened_gateway(sys.executable, [relay.node_peer, relay.relay_peer]))
        assert support.wait_for(lambda: relay.recording.with_token(node.token), 30), relay.recording.requests()
        return
    gw = gateway_to(node.token, *args)

    def by_peer() -> dict[str, dict]:
        with gw.client() as c:
            return {n["peer"]: n for n in c.get("/v1/nodes").json()["nodes"]}

    # Until the relay's candidate is refused, or it has the token (what a loosened check gives it).
    support.wait_for(lambda: relay.recording.with_token(node.token)
                     or "proved to be reached at" in (by_peer().get(relay.relay_peer, {}).get("error") or ""), 30)
    assert relay.recording.with_token(node.token) == []
    assert "proved to be reached at" in (by_peer().get(relay.relay_peer, {}).get("error") or ""), by_peer()
    relay.zone.records[NAME] = ["127.0.0.2", "127.0.0.1"]
    assert support.wait_for(lambda: by_peer().get(relay.node_peer, {}).get("state") == "up", 30), by_peer()
    asked = relay.recording.proofs_asked()
    assert support.wait_for(lambda: relay.recording.proofs_asked() >= asked + 2, 30)  # asked again, refused again
    seen = by_peer()
    assert seen[relay.node_peer]["node_id"] == "loop1" and seen[relay.relay_peer]["node_id"] is None, seen
    assert f"reached at {relay.node_peer}, not at {relay.relay_peer}" in seen[relay.relay_peer]["error"], seen
    with gw.client(timeout=httpx.Timeout(300, connect=5)) as c:  # the real node, reached through its name
        created = c.post("/v1/sandboxes", json={})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            assert "42" in support.stream_text(support.ok(support.execute(c, sid, "print(6 * 7)")))
        finally:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 200
    assert relay.recording.requests() and relay.recording.with_token(node.token) == []
    assert relay.recording.paths() == {"/v1/node/proof"}, relay.recording.requests()
