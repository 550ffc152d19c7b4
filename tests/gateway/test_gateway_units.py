"""The gateway's pure parts: sandbox ids that carry their node, and placement."""

from __future__ import annotations

import random
import re
import socket
from types import SimpleNamespace

import pytest
from traitlets import TraitError

from sandbox.core.config import ServiceConfig
from sandbox.gateway import placement
from sandbox.common.ids import new_sandbox_id, node_of
from sandbox.service.openapi import SANDBOX_ID


@pytest.mark.parametrize("node_id", ["node1", "gke-pool-1-a1b2c3d4-x9z8", "ip-10-0-0-1.eu-west-1.compute.internal", "a"])
def test_an_id_names_its_node(node_id):
    sandbox_id = new_sandbox_id(node_id)
    assert node_of(sandbox_id) == node_id
    assert re.fullmatch(SANDBOX_ID["schema"]["pattern"], sandbox_id), sandbox_id
    assert new_sandbox_id(node_id) != sandbox_id


def test_ids_without_a_node():
    assert node_of(new_sandbox_id("")) is None
    assert re.fullmatch(r"sbx-[0-9a-f]{16}", new_sandbox_id(""))
    for other in ("sbx-node1-0123", "sbx--0123456789abcdef", "abc", "sbx-Node-0123456789abcdef", "sbx-n-0123456789abcdeg"):
        assert node_of(other) is None, other


@pytest.mark.parametrize("bad", ["Node1", "-a", "a-", "a" * 41, "a_b", "a b", "a/b"])
def test_node_ids_are_checked(bad):
    with pytest.raises(TraitError):
        ServiceConfig(node_id=bad)
    assert ServiceConfig(node_id="a" * 40).node_id == "a" * 40


def node(node_id, *, sandboxes=0, cap=None, ready=0, draining=False, memory_free=8000, total=16000, images=("default",)):
    """A node's /v1/info as placement reads it (the capacity report of sandbox/core/capacity.py)."""
    return SimpleNamespace(node_id=node_id, info={
        "draining": draining, "defaults": {"memory_mb": 1024},
        "capacity": {"sandboxes": {"total": cap, "used": sandboxes, "free": None if cap is None else cap - sandboxes,
                                   "enforced": cap is not None},
                     "memory_mb": {"total": total, "used": total - memory_free, "free": memory_free, "enforced": False}},
        "pool": {image: {"ready": ready, "target": 1} for image in images},
    })


def ids(nodes):
    return [n.node_id for n in nodes]


def test_full_draining_short_of_memory_or_imageless_nodes_get_none():
    nodes = [node("full", sandboxes=10, cap=10), node("draining", draining=True), node("poor", memory_free=1000),
             node("other-image", images=("analytics",)), node("ok")]
    chosen, refused = placement.rank(nodes, "default", None)
    assert ids(chosen) == ["ok"]
    assert refused == {"full": "full (10 sandboxes)", "draining": "draining",
                       "poor": "1000 MiB of memory free, 1024 asked", "other-image": "no image 'default'"}
    assert ids(placement.rank(nodes, "default", 512)[0]) == ["ok", "poor"]  # a smaller request fits
    assert placement.rank(nodes, "default", 9000)[0] == []


def test_a_warm_sandbox_comes_first_then_the_most_free_capacity():
    nodes = [node("busy-warm", sandboxes=9, cap=10, ready=1), node("idle", sandboxes=1, cap=10), node("half", sandboxes=5, cap=10)]
    assert ids(placement.rank(nodes, "default", None)[0]) == ["busy-warm", "idle", "half"]
    nodes[0].info["pool"]["default"]["ready"] = 0
    assert ids(placement.rank(nodes, "default", 512)[0]) == ["idle", "half", "busy-warm"]
    # Without caps, by available memory, to the percent; then the fewest sandboxes.
    uncapped = [node("a", sandboxes=3, memory_free=8000), node("b", sandboxes=1, memory_free=8040), node("c", memory_free=12000)]
    assert ids(placement.rank(uncapped, "default", 512)[0]) == ["c", "b", "a"]


def test_a_node_lacking_a_published_image_may_pull_it_after_those_that_have_it():
    """An image a node published (pushed or pulled: its image_digests) makes the nodes that
    lack it candidates too, after every node that has it; unpublished, they get none."""
    nodes = [node("lacks-idle", images=("default",), memory_free=15000), node("has-busy", images=("default", "stats"), sandboxes=5),
             node("draining-publisher", images=("default", "stats"), draining=True)]
    assert placement.published(nodes, "stats") is None
    chosen, refused = placement.rank(nodes, "stats", None)
    assert ids(chosen) == ["has-busy"] and refused["lacks-idle"] == "no image 'stats'"
    nodes[2].info["image_digests"] = {"stats": "sha256:" + "a" * 64}
    assert placement.published(nodes, "stats") == "sha256:" + "a" * 64
    chosen, refused = placement.rank(nodes, "stats", None, pullable=True)
    assert ids(chosen) == ["has-busy", "lacks-idle"] and refused == {"draining-publisher": "draining"}
    assert placement.lacks(nodes[0].info, "stats") and not placement.lacks(nodes[1].info, "stats")


def test_a_burst_of_creates_spreads_before_the_next_refresh():
    nodes = [node(f"n{i}", cap=30, memory_free=60000, total=64000) for i in (1, 2, 3)]
    rng = random.Random(7)
    placed = []
    for _ in range(30):
        best = placement.rank(nodes, "default", 512, rng)[0][0]
        placement.note_placed(best.info, "default", from_pool=False)
        placed.append(best.node_id)
    assert {n: placed.count(n) for n in ("n1", "n2", "n3")} == {"n1": 10, "n2": 10, "n3": 10}
    warm = node("w", cap=30, ready=1)
    placement.note_placed(warm.info, "default", from_pool=True)
    assert warm.info["pool"]["default"]["ready"] == 0 and warm.info["capacity"]["sandboxes"]["free"] == 29
    assert warm.info["capacity"]["memory_mb"]["free"] == 8000 - 1024


def test_the_relay_pool_lends_the_newest_idle_connection_and_never_a_stale_one():
    """A connection idle for longer than the pool trusts (the node may be closing it just as
    a request goes out) is closed, not lent; real connections over socket pairs."""
    import asyncio
    import socket

    from sandbox.gateway.pool import Pool, UpstreamConnection

    async def scenario():
        loop = asyncio.get_running_loop()
        pairs = [socket.socketpair() for _ in range(3)]
        fresh_pool, stale_pool = Pool(max_idle=10, idle_seconds=3600), Pool(max_idle=10, idle_seconds=0)
        conns = []
        for n, (ours, _) in enumerate(pairs):
            pool = fresh_pool if n < 2 else stale_pool
            _, conn = await loop.create_connection(lambda pool=pool: UpstreamConnection(pool), sock=ours)
            pool.keep(conn)
            conns.append(conn)
        newest = fresh_pool.take()
        nothing = fresh_pool.take(), fresh_pool.take()
        await asyncio.sleep(0.01)
        stale = stale_pool.take()
        await asyncio.sleep(0.01)
        try:
            assert newest is conns[1] and nothing == (conns[0], None)
            assert stale is None and conns[2].closed and not conns[1].closed
        finally:
            for ours, theirs in pairs:
                theirs.close()

    asyncio.run(scenario())


def test_a_node_proof_holds_only_for_the_token_and_the_address():
    from sandbox.service import nodeproof

    challenge, token = "ab" * 16, "node-token"
    answer = {"node_id": "n1", "address": "10.0.0.5:8765", "proof": nodeproof.proof(token, challenge, "n1", "10.0.0.5:8765")}
    assert nodeproof.verify(token, challenge, answer, "10.0.0.5:8765") is None
    assert "does not match" in nodeproof.verify("another-token", challenge, answer, "10.0.0.5:8765")
    assert "does not match" in nodeproof.verify(token, "cd" * 16, answer, "10.0.0.5:8765")  # an old challenge
    assert "reached at 10.0.0.5:8765" in nodeproof.verify(token, challenge, answer, "10.0.0.9:8765")  # a relay
    assert "does not match" in nodeproof.verify(token, challenge, {**answer, "node_id": "n2"}, "10.0.0.5:8765")
    assert nodeproof.address_text("::1", 80) == "[::1]:80"


def test_a_node_id_is_held_by_one_address_at_a_time():
    from sandbox.gateway.identity import Claims

    claims, there = Claims(), {"a": True, "b": True}
    assert claims.claim("n1", "a", there.get) == ""
    assert "duplicate node id" in claims.claim("n1", "b", there.get)
    assert claims.holder_of("a") == "n1" and claims.holder_of("b") is None
    there["a"] = False  # the holder is down: a node back at a new address takes its id
    assert claims.claim("n1", "b", there.get) == "" and claims.holder_of("b") == "n1"
    assert claims.claim("n2", "b", there.get) == "" and claims.holder["n2"] == "b" and "n1" not in claims.holder


def test_a_host_name_with_several_addresses_is_several_candidate_nodes():
    import asyncio

    from dns_zone import Zone
    from sandbox.gateway.discovery import DnsLookup, StaticNodes

    zone = Zone()
    try:
        async def lookups():
            nodes = StaticNodes(["http://nodes.test:8765/", "http://10.0.0.9:8765"], DnsLookup(zone.server_arg, timeout=1))
            zone.records["nodes.test"] = ["10.0.0.2", "10.0.0.1", "fd00::5"]
            first = await nodes.addresses()
            zone.records["nodes.test"] = ["10.0.0.1"]
            second = await nodes.addresses()
            zone.close()  # the resolver goes away: the last answer stands
            third = await nodes.addresses()
            return first, second, third

        first, second, third = asyncio.run(lookups())
    finally:
        zone.close()
    assert [(t.url, t.peer) for t in first] == [
        ("http://nodes.test:8765", "10.0.0.1:8765"), ("http://nodes.test:8765", "10.0.0.2:8765"),
        ("http://nodes.test:8765", "[fd00::5]:8765"), ("http://10.0.0.9:8765", "10.0.0.9:8765")]
    assert [t.label for t in first[1:]] == ["http://nodes.test:8765 at 10.0.0.2:8765",
                                            "http://nodes.test:8765 at [fd00::5]:8765", "http://10.0.0.9:8765"]
    assert [t.peer for t in second] == ["10.0.0.1:8765", "10.0.0.9:8765"]
    assert third == second


def test_a_node_client_connects_only_to_its_address_and_keeps_the_nodes_name():
    """Both ways the gateway talks to a node (its own calls, the relayed ones) go to the
    target's IP whatever its URL's host name resolves to, with the name as the Host. Control:
    a plain client given the same URL looks the name up (here it resolves nowhere)."""
    import asyncio
    import http.server
    import threading

    import httpx

    from sandbox.gateway.discovery import Target
    from sandbox.gateway.pinned import pinned_client
    from sandbox.gateway.pool import NodeUpstream

    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts.append(self.headers["host"])
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    target = Target(f"http://node.invalid:{port}", "127.0.0.1", port)

    async def calls():
        timeout = httpx.Timeout(10)
        async with pinned_client(target, timeout=timeout, limits=httpx.Limits()) as client:
            answer = (await client.get("/v1/info")).text
        async with httpx.AsyncClient(base_url=target.url, timeout=timeout) as plain:
            try:
                await plain.get("/v1/info")
                plain_result = "reached"
            except httpx.ConnectError as exc:
                plain_result = type(exc).__name__
        upstream = NodeUpstream(target, "node-token", 10)
        conn = await upstream.connect()
        peer = conn.transport.get_extra_info("peername")
        conn.transport.close()
        return answer, plain_result, peer, upstream.fixed_head

    try:
        answer, plain_result, peer, head = asyncio.run(calls())
    finally:
        server.shutdown()
        server.server_close()
    assert answer == "ok" and hosts == [f"node.invalid:{port}"]
    assert plain_result == "ConnectError"  # the control: the name alone reaches nothing
    assert peer[:2] == ("127.0.0.1", port) and head.startswith(f"host: node.invalid:{port}\r\n".encode())


def test_a_pinned_node_client_over_tls_names_the_node_not_its_address(tmp_path):
    """The TLS server name (SNI) a pinned client sends, and the name it checks the certificate
    against, are the URL's host name, not the IP it connects to. (The test CA is not one the
    client trusts, so the handshake ends there: the server has seen the name by then, and the
    client's refusal is about the certificate's issuer, not its name.) Control: a client given
    the IP itself sends no server name."""
    import asyncio
    import ssl
    import threading

    import httpx

    from egress.apihost import NAMES, make_test_ca
    from sandbox.gateway.discovery import Target
    from sandbox.gateway.pinned import pinned_client

    _, cert_path = make_test_ca(tmp_path)
    names: list[str | None] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path)
    context.sni_callback = lambda conn, name, ctx: names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            try:
                context.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                pass
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()

    async def handshakes() -> list[str]:
        errors = []
        for target in (Target(f"https://{NAMES[0]}:{port}", "127.0.0.1", port),
                       Target(f"https://127.0.0.1:{port}", "127.0.0.1", port)):
            async with pinned_client(target, timeout=httpx.Timeout(10), limits=httpx.Limits()) as client:
                try:
                    await client.get("/v1/info")
                except httpx.ConnectError as exc:
                    errors.append(str(exc))
        return errors

    try:
        errors = asyncio.run(handshakes())
    finally:
        listener.close()
    assert names == [NAMES[0], None], names
    assert "unable to get local issuer certificate" in errors[0], errors
