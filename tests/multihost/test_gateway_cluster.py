"""The gateway over several real hosts: three node servers and two (then three) gateways, each
in its own network namespace with its own address, on one bridge.

One scenario, in order (module-scoped cluster): 60 sandboxes through either gateway, spread
over the nodes and each keeping its state through the other gateway; files and errors
through; the kernel through a gateway; DNS discovery from a resolver the test runs; a
draining node; a gateway killed and restarted; a node killed (server and supervisors) whose
sandboxes, and only they, answer 410 "node gone" while the others run on.

Skipped, with the reason printed, when this machine cannot make network namespaces (not
root, no iproute2).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import secrets
import tempfile
import threading
import time
import typing as t

import httpx
import pytest

import support
import netns_hosts as hosts
from dns_zone import Zone
from gateway_cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N_SANDBOXES = 60
GONE_AFTER = 4.0  # the gateways' --node-gone-seconds: short, so the test need not wait long
GATEWAY_ARGS = ("--refresh-seconds", "0.5", "--node-timeout-seconds", "2", "--node-gone-seconds", str(GONE_AFTER))
NODE_ARGS = ("--pool-size", "1", "--set", "max_sandboxes=40")


def node_of(sandbox_id: str) -> str:
    from sandbox.common.ids import node_of as parse

    return parse(sandbox_id)


@pytest.fixture(scope="module")
def cluster(sandbox_server: support.Server) -> t.Iterator[Cluster]:
    why = hosts.why_not_available()
    if why:
        print(f"\nSKIPPED multi-host tests: {why}")
        pytest.skip(why)
    if sandbox_server.external:
        pytest.skip("the nodes borrow the session server's images, which are on another host")
    net = hosts.Network().open()
    work = pathlib.Path(tempfile.mkdtemp(prefix="sbk-mh-"))
    c = Cluster(net, secrets.token_hex(16), sandbox_server.state_dir, work)
    try:
        for node_id in ("node1", "node2", "node3"):
            c.add_node(node_id, *NODE_ARGS)
        nodes = [f"--node=http://{n.host.address}:8765" for n in c.nodes]
        c.add_gateway("gw1", *nodes, *GATEWAY_ARGS)
        c.add_gateway("gw2", *nodes, *GATEWAY_ARGS)
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()
        left = net.leftovers()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
        assert not left, f"network namespaces or links left behind: {left}"


def run(client: httpx.Client, sandbox_id: str, code: str) -> list[dict]:
    return support.execute(client, sandbox_id, code)


def printed(client: httpx.Client, sandbox_id: str, code: str) -> str:
    return support.stream_text(support.ok(run(client, sandbox_id, code)))


@pytest.fixture(scope="module")
def sixty(cluster: Cluster) -> dict[str, int]:
    """60 sandboxes, created alternately through gw1 and gw2, each with ``x`` set through
    the gateway that made it: {sandbox id: its x}."""
    gws = cluster.gateways[:2]
    local = threading.local()

    def client(i: int) -> httpx.Client:
        key = f"c{i % 2}"
        if not hasattr(local, key):
            setattr(local, key, gws[i % 2].client(timeout=120))
        return getattr(local, key)

    def make(i: int) -> tuple[str, int]:
        c = client(i)
        sbx = support.create(c, ttl_seconds=1800)
        support.ok(run(c, sbx["id"], f"x = {i} * 7"))
        return sbx["id"], i * 7

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        made = dict(pool.map(make, range(N_SANDBOXES)))
    assert len(made) == N_SANDBOXES
    return made


def test_sandboxes_spread_over_the_nodes_and_keep_state_through_the_other_gateway(cluster: Cluster, sixty: dict):
    per_node: dict[str, int] = {}
    for sandbox_id in sixty:
        per_node[node_of(sandbox_id)] = per_node.get(node_of(sandbox_id), 0) + 1
    assert set(per_node) == {"node1", "node2", "node3"}, per_node
    assert min(per_node.values()) >= 12, f"placement did not spread by free capacity: {per_node}"

    # Each id names the node that really holds it (asked directly, not through a gateway).
    for node in cluster.nodes:
        with node.client() as c:
            held = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert held == {i for i in sixty if node_of(i) == node.node_id}

    gw1, gw2 = (g.client() for g in cluster.gateways[:2])
    with gw1, gw2:
        for n, (sandbox_id, x) in enumerate(sixty.items()):
            other = gw2 if n % 2 == 0 else gw1  # made through gw1 for even n
            assert printed(other, sandbox_id, "print(x)") == f"{x}\n"
        listed = gw2.get("/v1/sandboxes").json()
        assert {s["id"] for s in listed["sandboxes"]} == set(sixty)
        assert listed["nodes_unavailable"] == []


def test_the_api_is_the_nodes_api(cluster: Cluster, sixty: dict):
    gw = cluster.gateways[0]
    node = cluster.nodes[0]
    sandbox_id = next(i for i in sixty if node_of(i) == node.node_id)
    with gw.client() as g, node.client() as n:
        # Same token rule and wording.
        for path in ("/v1/sandboxes", f"/v1/sandboxes/{sandbox_id}"):
            a, b = httpx.get(gw.url + path), httpx.get(node.url + path)
            assert (a.status_code, a.json()) == (b.status_code, b.json()) == (401, b.json())
        # A sandbox's status is the node's.
        assert g.get(f"/v1/sandboxes/{sandbox_id}").json()["id"] == n.get(f"/v1/sandboxes/{sandbox_id}").json()["id"]
        # The node's errors come through as they are.
        for path in (f"/v1/sandboxes/{sandbox_id}/files//etc/passwd", f"/v1/sandboxes/{sandbox_id}/files/nope.txt"):
            a, b = g.get(path), n.get(path)
            assert (a.status_code, a.json()) == (b.status_code, b.json()), (a.text, b.text)
        bad = g.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": 1})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
        bad = g.post("/v1/sandboxes", json={"memory_mb": "lots"})
        assert bad.status_code == 422 and "memory_mb" in bad.json()["error"]["message"]
        # Ids the gateway cannot place: unknown form (404), a node nobody knows (410).
        r = g.get("/v1/sandboxes/sbx-0123456789abcdef")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = g.get("/v1/sandboxes/sbx-nowhere-0123456789abcdef")
        assert r.status_code == 410, r.text
        assert "the node nowhere is gone" in r.json()["error"]["message"]
        # The same OpenAPI, plus the gateway's node routes, less the node's own (its drain,
        # and the identity proof the gateway asks of it).
        doc, node_doc = g.get("/v1/openapi.json").json(), n.get("/v1/openapi.json").json()
        node_own = {"/v1/node/drain", "/v1/node/proof"}
        assert set(doc["paths"]) == (set(node_doc["paths"]) - node_own) | {"/v1/nodes", "/v1/nodes/{node_id}/drain"}
        assert doc["paths"]["/v1/sandboxes/{sandbox_id}/execute"] == node_doc["paths"]["/v1/sandboxes/{sandbox_id}/execute"]
        nodes = {x["node_id"]: x for x in g.get("/v1/nodes").json()["nodes"]}
        assert set(nodes) == {"node1", "node2", "node3"} and all(x["state"] == "up" for x in nodes.values())


def test_files_stream_through_either_gateway(cluster: Cluster, sixty: dict):
    sandbox_id = next(iter(sixty))
    data = os.urandom(3 * 1024 * 1024 + 17)

    def chunks() -> t.Iterator[bytes]:
        for i in range(0, len(data), 256 * 1024):
            yield data[i:i + 256 * 1024]

    with cluster.gateways[1].client() as up, cluster.gateways[0].client() as down:
        r = up.put(f"/v1/sandboxes/{sandbox_id}/files/in%20dir/blob.bin", content=chunks())
        assert r.status_code == 201, r.text
        assert r.json()["size"] == len(data)
        got = down.get(f"/v1/sandboxes/{sandbox_id}/files/in%20dir/blob.bin")
        assert got.status_code == 200 and got.content == data
        inside = printed(down, sandbox_id, "import hashlib; print(hashlib.sha256(open('in dir/blob.bin','rb').read()).hexdigest())")
        assert inside.strip() == hashlib.sha256(data).hexdigest()
        listing = up.get(f"/v1/sandboxes/{sandbox_id}/files").json()["files"]
        assert any(f["path"] == "in dir/blob.bin" for f in listing)


def test_the_kernel_works_through_a_gateway(cluster: Cluster, tmp_path):

    gw = cluster.gateways[1]
    env = support.with_repo_on_path(dict(os.environ))
    jupyter_data = support.install_kernelspec()
    env.update({"SANDBOX_KERNEL_URL": gw.url, "SANDBOX_KERNEL_TOKEN": gw.token, "SANDBOX_KERNEL_START_SERVER": "0",
                "JUPYTER_PATH": str(jupyter_data)})
    # a notebook folder of its own: the checkout is on the tests' PYTHONPATH, where a kernel refuses to start
    km, kc = support.start_kernel("sandbox", env=env, startup_timeout=90, cwd=str(tmp_path))
    try:
        first = support.run_cell(kc, "import socket; y = 6 * 7; print(y)")
        assert first.status == "ok", first.outputs
        assert first.stdout == "42\n"
        again = support.run_cell(kc, "y + 1")
        assert again.result_text() == "43"
        info = support.run_cell(kc, "%sandbox")
        assert "sbx-node" in info.stdout, info.stdout  # a node-tagged id, made through the gateway
        failing = support.run_cell(kc, "1/0", stop_on_error=False)
        assert failing.status == "error" and failing.errors[0]["ename"] == "ZeroDivisionError"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def test_dns_discovery_follows_the_records(cluster: Cluster, sixty: dict):
    zone = Zone(cluster.net.gateway_address)
    node1, node2, node3 = cluster.nodes
    zone.records["nodes.sandbox.test"] = [node1.host.address]
    try:
        gw = cluster.add_gateway("gw3", "--dns-name", "nodes.sandbox.test",
                                 "--dns-server", zone.server_arg, *GATEWAY_ARGS)
        with gw.client() as g:
            def states() -> dict:
                return {n["node_id"]: (n["state"], n["in_discovery"]) for n in g.get("/v1/nodes").json()["nodes"]}

            assert states() == {"node1": ("up", True)}
            sbx = support.create(g)
            assert node_of(sbx["id"]) == "node1"
            g.delete(f"/v1/sandboxes/{sbx['id']}")

            zone.records["nodes.sandbox.test"] = [node1.host.address, node3.host.address]
            assert wait_for(lambda: states() == {"node1": ("up", True), "node3": ("up", True)}, 20), states()
            on_node3 = next(i for i in sixty if node_of(i) == "node3")
            assert printed(g, on_node3, "print(x)") == f"{sixty[on_node3]}\n"

            zone.records["nodes.sandbox.test"] = [node1.host.address]
            assert wait_for(lambda: states().get("node3") == ("down", False), 20), states()
            r = g.get(f"/v1/sandboxes/{on_node3}")
            assert r.status_code == 503, r.text  # left discovery, not yet long enough to be gone
    finally:
        zone.close()
        gw.stop()
        cluster.gateways.remove(gw)


def test_a_draining_node_gets_no_new_sandbox(cluster: Cluster, sixty: dict):
    gw1, gw2 = cluster.gateways[:2]
    with gw1.client() as a, gw2.client() as b:
        r = a.post("/v1/nodes/node3/drain", json={"draining": True})
        assert r.status_code == 200 and r.json()["draining"] is True, r.text
        try:
            assert wait_for(lambda: {n["node_id"]: n["state"] for n in b.get("/v1/nodes").json()["nodes"]}["node3"]
                            == "draining", 10)
            made = [support.create(c)["id"] for c in (a, b) * 2]
            assert [node_of(i) for i in made if node_of(i) == "node3"] == []
            # Its existing sandboxes run on.
            on_node3 = [i for i in sixty if node_of(i) == "node3"][:3]
            for sandbox_id in on_node3:
                assert printed(b, sandbox_id, "print(x)") == f"{sixty[sandbox_id]}\n"
            # And asked directly, the node itself refuses.
            with cluster.node("node3").client() as n:
                r = n.post("/v1/sandboxes", json={})
                assert r.status_code == 503 and "draining" in r.json()["error"]["message"]
            for sandbox_id in made:
                a.delete(f"/v1/sandboxes/{sandbox_id}")
        finally:
            a.post("/v1/nodes/node3/drain", json={"draining": False})


def test_a_gateway_restart_loses_nothing(cluster: Cluster, sixty: dict):
    gw1 = cluster.gateways[0]
    gw1.kill9()
    gw1.start()
    with gw1.client() as g:
        for sandbox_id, x in sixty.items():
            assert printed(g, sandbox_id, "x += 1; print(x)") == f"{x + 1}\n"
            sixty[sandbox_id] = x + 1


def test_a_killed_node_turns_exactly_its_sandboxes_gone(cluster: Cluster, sixty: dict):
    gw1, gw2 = cluster.gateways[:2]
    node2 = cluster.node("node2")
    on_node2 = [i for i in sixty if node_of(i) == "node2"]
    others = [i for i in sixty if node_of(i) != "node2"]
    assert on_node2 and others

    # A cell running on node2 when it dies: its stream must end, saying so.
    stream_result: dict = {}

    def long_cell() -> None:
        with gw1.client(timeout=120) as c:
            stream_result["events"] = run(c, on_node2[0], "import time; print('started', flush=True); time.sleep(60)")

    runner = threading.Thread(target=long_cell)
    runner.start()
    with gw2.client() as c:
        assert wait_for(lambda: c.get(f"/v1/sandboxes/{on_node2[0]}").json().get("executing"), 30)
    victims = node2.kill_everything()
    assert victims, "node2 had no supervisors to kill"
    node2.host.link(up=False)  # and the host is off the network: nothing answers at all
    runner.join(60)
    assert not runner.is_alive(), "the execute stream hung after its node died"
    events = stream_result["events"]
    assert support.stream_text(events) == "started\n"
    done = support.done_of(events)
    assert done["status"] == "error" and done["reason"] == "node_unavailable", events

    with gw1.client() as a, gw2.client() as b:
        def gone(client: httpx.Client, sandbox_id: str) -> bool:
            r = client.get(f"/v1/sandboxes/{sandbox_id}")
            return r.status_code == 410

        assert wait_for(lambda: gone(a, on_node2[0]) and gone(b, on_node2[0]), GONE_AFTER + 20)
        for client in (a, b):
            for sandbox_id in on_node2:
                began = time.monotonic()
                r = client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": "print(x)"})
                assert time.monotonic() - began < 10, "a call for a gone node's sandbox must not hang"
                assert r.status_code == 410, r.text
                body = r.json()["error"]
                assert body["code"] == "gone" and body["reason"] == "node_gone"
                assert "the node node2 is gone" in body["message"]
        for n, sandbox_id in enumerate(others):
            client = a if n % 2 else b
            assert printed(client, sandbox_id, "print(x)") == f"{sixty[sandbox_id]}\n"
        listed = a.get("/v1/sandboxes").json()
        assert {s["id"] for s in listed["sandboxes"]} == set(others)
        assert [u["node_id"] for u in listed["nodes_unavailable"]] == ["node2"]
        # New sandboxes go to the living nodes only.
        made = [support.create(client)["id"] for client in (a, b, a, b)]
        assert all(node_of(i) in ("node1", "node3") for i in made), made
        for sandbox_id in made:
            a.delete(f"/v1/sandboxes/{sandbox_id}")
