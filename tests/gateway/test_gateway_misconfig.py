"""A gateway that cannot place a sandbox names the misconfiguration it sees: a node started
without --node-id (it answers, but its sandboxes could not be routed), or no node at all."""

from __future__ import annotations

import support


def test_a_node_without_a_node_id_is_named(spawn_server, gateway_to):
    node = spawn_server()  # `serve` without --node-id
    gw = gateway_to(node.token, "--node", node.url, "--refresh-seconds", "0.5")
    with gw.client() as c:
        assert support.wait_for(lambda: any(n["state"] == "no_node_id" for n in c.get("/v1/nodes").json()["nodes"]),
                                30), c.get("/v1/nodes").json()
        r = c.post("/v1/sandboxes", json={})
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "has no node id" in message and "--node-id NAME" in message and node.url.split("//")[1] in message, message


def test_no_node_at_all_says_what_the_gateway_was_given(gateway_to):
    gw = gateway_to("t" * 32, "--node", f"http://127.0.0.1:{support.free_port()}", "--refresh-seconds", "0.5")
    with gw.client() as c:
        r = c.post("/v1/sandboxes", json={})
    assert r.status_code == 503 and "no node can take a new sandbox" in r.json()["error"]["message"], r.text
