"""The gateway's node proof is bound to the connection, over real hosts (network namespaces).

A node's host name has two A records in a DNS server the test runs: the real node's host and
a relay's host, where a relay passes every request on to the real node and records what it is
sent (``node_proof_probe.py``). The gateway is given the name (``--node http://NAME:8765``);
each address is a candidate node of its own. The relay's candidate is asked for its proof,
which names the real node's address, not the one the gateway connected to: it is refused, and
never receives the node token (the Authorization header it sees is recorded), while the real
node is reached through the gateway. Control: the same gateway with its check loosened back
to "any address of the host name" hands the relay the token, so the recording does see a
token when one is sent.

Skipped, with the reason printed, when this machine cannot make network namespaces.
"""

from __future__ import annotations

import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import types
import typing as t

import pytest

import netns_hosts as hosts
import support
from dns_zone import Zone
from gateway_cluster import NODE_PORT, Cluster, wait_for
from node_proof_probe import Recording, loosened_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "nodes.proof.test"
GATEWAY_ARGS = (f"--node=http://{NAME}:{NODE_PORT}", "--refresh-seconds", "0.5", "--node-timeout-seconds", "2")
PROBE = pathlib.Path(support.REPO) / "tests" / "node_proof_probe.py"


@pytest.fixture(scope="module")
def proof_hosts(sandbox_server: support.Server) -> t.Iterator[types.SimpleNamespace]:
    """A node host, a relay host in front of it, and the test's DNS server on the bridge."""
    why = hosts.why_not_available()
    if why:
        print(f"\nSKIPPED multi-host node-proof tests: {why}")
        pytest.skip(why)
    if sandbox_server.external:
        pytest.skip("the node borrows the session server's images, which are on another host")
    net = hosts.Network().open()
    work = pathlib.Path(tempfile.mkdtemp(prefix="sbk-mh-proof-"))
    cluster = Cluster(net, secrets.token_hex(16), sandbox_server.state_dir, work)
    zone = None
    try:
        node = cluster.add_node("proof1", "--pool-size", "1", "--set", "max_sandboxes=4")
        relay = net.host("relay")
        record = work / "relay.jsonl"
        with open(work / "relay.log", "ab") as log:
            relay.popen([sys.executable, str(PROBE), relay.address, str(NODE_PORT), node.url, str(record)],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        assert wait_for(lambda: _listening(relay.address, NODE_PORT), 30), (work / "relay.log").read_text()
        zone = Zone(net.gateway_address)
        yield types.SimpleNamespace(cluster=cluster, node=node, relay=relay, recording=Recording(record), zone=zone,
                                    node_peer=f"{node.host.address}:{NODE_PORT}",
                                    relay_peer=f"{relay.address}:{NODE_PORT}")
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        if zone is not None:
            zone.close()
        cluster.close()
        left = net.leftovers()
        shutil.rmtree(work, ignore_errors=True)
        assert not left, f"network namespaces or links left behind: {left}"


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_relay_at_a_second_address_of_the_nodes_name_never_gets_the_token(proof_hosts):
    h = proof_hosts
    h.zone.records[NAME] = [h.relay.address]  # the relay is asked first: the name's only record
    gw = h.cluster.add_gateway("gw-exact", "--dns-server", h.zone.server_arg, *GATEWAY_ARGS)
    try:
        with gw.client() as g:
            def by_peer() -> dict[str, dict]:
                return {n["peer"]: n for n in g.get("/v1/nodes").json()["nodes"]}

            def refused() -> str:
                return by_peer().get(h.relay_peer, {}).get("error") or ""

            # Until the relay's candidate is refused, or it has the token (what a loosened check gives it).
            wait_for(lambda: h.recording.with_token(h.cluster.token) or "proved to be reached at" in refused(), 30)
            assert h.recording.with_token(h.cluster.token) == []
            assert f"reached at {h.node_peer}, not at {h.relay_peer}" in refused(), by_peer()

            h.zone.records[NAME] = [h.relay.address, h.node.host.address]  # the name's two addresses
            assert wait_for(lambda: by_peer().get(h.node_peer, {}).get("state") == "up", 30), by_peer()
            asked = h.recording.proofs_asked(gw.host.address)
            # Still a candidate beside the real node: asked again, refused again.
            assert wait_for(lambda: h.recording.proofs_asked(gw.host.address) >= asked + 2, 30)
            seen = by_peer()
            assert seen[h.node_peer]["node_id"] == "proof1" and seen[h.node_peer]["address"].startswith(f"http://{NAME}:")
            assert seen[h.relay_peer]["state"] == "down" and seen[h.relay_peer]["node_id"] is None, seen

            sbx = support.create(g)  # the real node is reached, through its name
            try:
                assert sbx["id"].startswith("sbx-proof1-")
                support.ok(support.execute(g, sbx["id"], "x = 41"))
                assert support.stream_text(support.ok(support.execute(g, sbx["id"], "print(x + 1)"))) == "42\n"
            finally:
                assert g.delete(f"/v1/sandboxes/{sbx['id']}").status_code == 200
        sent = h.recording.requests(gw.host.address)
        assert sent, "the relay was never asked: the test shows nothing"
        assert h.recording.with_token(h.cluster.token, gw.host.address) == []
        assert h.recording.paths(gw.host.address) == {"/v1/node/proof"}, sent
    finally:
        gw.stop()
        h.cluster.gateways.remove(gw)


def test_control_with_the_check_loosened_to_any_address_of_the_name_the_relay_gets_the_token(proof_hosts):
    """The same gateway, but a proof may name any of the name's addresses (the check before):
    the relay's candidate, asked first, passes with the real node's proof and gets the token."""
    h = proof_hosts
    h.zone.records[NAME] = [h.relay.address]
    launcher = loosened_gateway(sys.executable, [h.node_peer, h.relay_peer])
    gw = h.cluster.add_gateway("gw-loose", "--dns-server", h.zone.server_arg, *GATEWAY_ARGS, launcher=launcher)
    try:
        assert wait_for(lambda: h.recording.with_token(h.cluster.token, gw.host.address), 30), \
            (h.recording.requests(gw.host.address), gw.log_tail())
    finally:
        gw.stop()
        h.cluster.gateways.remove(gw)
