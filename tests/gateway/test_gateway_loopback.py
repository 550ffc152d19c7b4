"""The gateway in front of one real node server, on loopback: the Python client unchanged,
streams through in both directions, a client that goes away, a node that stops answering,
and DNS discovery from a resolver the test runs. (Several hosts: tests/multihost/.)"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

import support
from sandbox import Sandbox, SandboxGone
from sandbox.gateway.discovery import DnsNodes
from dns_zone import Zone

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow
def test_the_client_works_unchanged_through_the_gateway(gateway):
    data = os.urandom(2 * 1024 * 1024 + 5)
    with Sandbox.create(url=gateway.url, token=gateway.token, ttl_seconds=600) as sbx:
        assert sbx.id.startswith("sbx-loop1-")
        assert sbx.run_code("z = 20 + 1").ok
        seen: list[str] = []
        run = sbx.run_code("print(z * 2)", on_stdout=seen.append)
        assert run.ok and "".join(seen) == "42\n"
        sbx.files.write("d/blob.bin", iter([data[:1000], data[1000:]]))
        assert sbx.files.read("d/blob.bin") == data
        assert "d/blob.bin" in [f.path for f in sbx.files.list()]
        assert sbx.is_complete("for i in z:")["status"] == "incomplete"  # (complete: jedi, slow on a busy host)
        assert sbx.id in [s.id for s in Sandbox.list(url=gateway.url, token=gateway.token)]
        sandbox_id = sbx.id
    with pytest.raises(SandboxGone):  # the node's own 410 for a deleted sandbox, passed through
        Sandbox.connect(sandbox_id, url=gateway.url, token=gateway.token).refresh()


def test_an_agents_scope_holds_through_the_gateway(gateway):
    """The gateway passes Sandbox-Scope on (its create, its listing and its byte relay), so
    the node's rule holds behind it: an agent reaches its own sandboxes only, not the user's
    notebook sandbox nor another agent's, which answer as unknown ids (404) and are not listed.
    Control: the scope that made a sandbox, and the unscoped user, reach it."""
    def scoped(scope: str | None) -> httpx.Client:
        client = gateway.client()
        if scope:
            client.headers["Sandbox-Scope"] = scope
        return client

    with scoped("agent-a") as agent_a, scoped("agent-b") as agent_b, scoped(None) as user:
        mine = support.create(agent_a, ttl_seconds=300)["id"]
        users = support.create(user, ttl_seconds=300)["id"]
        try:
            for sandbox_id in (mine, users):
                assert agent_b.get(f"/v1/sandboxes/{sandbox_id}").status_code == 404
                refused = agent_b.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": "1"})
                assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found", refused.text
            assert agent_a.get(f"/v1/sandboxes/{users}").status_code == 404
            listed_b = {s["id"] for s in agent_b.get("/v1/sandboxes").json()["sandboxes"]}
            assert not {mine, users} & listed_b, listed_b
            # Control: its own scope and the user reach it, through the listing and the relay.
            assert mine in {s["id"] for s in agent_a.get("/v1/sandboxes").json()["sandboxes"]}
            assert {mine, users} <= {s["id"] for s in user.get("/v1/sandboxes").json()["sandboxes"]}
            events = support.stream_events(agent_a, "POST", f"/v1/sandboxes/{mine}/execute", json={"code": "6 * 7"})
            assert any(e.get("data", {}).get("text/plain") == "42" for e in events), events
        finally:
            for sandbox_id in (mine, users):
                user.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.mark.slow
def test_a_full_node_freed_behind_the_gateways_back_takes_the_next_sandbox(node, rarely_refreshing_gateway):
    """A gateway that refreshes rarely still places a sandbox on a node that was full in its
    last info but has room now (a sandbox deleted on the node itself, or through another
    gateway): placement asks the nodes again before it says no."""
    gw = rarely_refreshing_gateway
    made: list[str] = []
    try:
        with gw.client() as c, httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"},
                                            timeout=60) as direct:
            while True:  # fill the node (max_sandboxes=3), whatever other tests left on it
                r = c.post("/v1/sandboxes", json={})
                if r.status_code != 201:
                    assert r.status_code == 503 and "full" in r.text, r.text
                    break
                made.append(r.json()["id"])
            assert made, "the node had no room to start with"
            assert direct.delete(f"/v1/sandboxes/{made.pop()}").status_code in (200, 204)
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            made.append(r.json()["id"])
    finally:
        with httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"}, timeout=60) as direct:
            for sandbox_id in made:
                direct.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.mark.slow
def test_an_execute_streams_its_events_as_they_happen(gateway):
    """Each event reaches the client before the cell goes on (no buffering in the gateway)."""
    with gateway.client() as c:
        sandbox_id = support.create(c)["id"]
        try:
            code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5 if i < 2 else 60)\n"
            text = ""
            with c.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code}) as r:
                for line in r.iter_lines():
                    event = json.loads(line)
                    assert event["type"] == "stream", event
                    text += event["text"]
                    if text.endswith("2\n"):
                        break  # the cell still sleeps for a minute: this came through at once
            assert text == "0\n1\n2\n"
            # Leaving the stream interrupted that cell: the next one runs now, not in a minute.
            events = support.execute(c, sandbox_id, "print('next')", timeout_seconds=30)
            assert support.stream_text(support.ok(events)) == "next\n"
        finally:
            c.delete(f"/v1/sandboxes/{sandbox_id}")


def test_gateway_info_and_nodes(gateway, node):
    with gateway.client() as c:
        info = c.get("/v1/info").json()
        assert info["role"] == "gateway" and [n["node_id"] for n in info["nodes"]] == ["loop1"]
        [summary] = c.get("/v1/nodes").json()["nodes"]
        assert summary["state"] == "up" and summary["address"] == node.url
        assert summary["capacity"]["memory_mb"]["total"] > 0
        r = c.post("/v1/nodes/nope/drain", json={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = c.post("/v1/images", json={"name": "x"})
        assert r.status_code == 501 and r.json()["error"]["code"] == "not_supported"
        assert "default" in [i["name"] for i in c.get("/v1/images").json()["images"]]


def test_gateway_metrics(gateway):
    from prometheus_client.parser import text_string_to_metric_families

    with gateway.client() as c:
        response = c.get("/metrics")
        assert response.status_code == 200, response.text
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        assert [(s.labels, s.value) for s in families["sandbox_kernel_gateway_nodes"].samples] == [({"state": "up"}, 1)]
        assert families["sandbox_kernel_process_open_fds"].samples[0].value > 0
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        assert anonymous.get("/metrics").status_code == 401


def test_gateway_gathers_every_nodes_usage_records(gateway, node):
    with Sandbox.create(url=gateway.url, token=gateway.token, ttl_seconds=600) as sbx:
        assert sbx.run_code("1").ok
        sandbox_id = sbx.id
    with gateway.client() as c, node.client() as n:
        answer = c.get("/v1/usage").json()
        own = n.get("/v1/usage").json()["records"]
    assert answer["nodes_unavailable"] == []
    assert {r["node"] for r in answer["records"]} == {"loop1"}
    assert sorted(r["sandbox_id"] for r in answer["records"]) == sorted(r["sandbox_id"] for r in own)
    assert sandbox_id in [r["sandbox_id"] for r in own]


@pytest.mark.slow
def test_the_node_reports_what_placement_needs_and_can_be_drained(node, gateway):
    with node.client() as n:
        info = n.get("/v1/info").json()
        assert info["node_id"] == "loop1" and info["draining"] is False
        slots = info["capacity"]["sandboxes"]
        assert slots["total"] == 3 and slots["enforced"] and slots["free"] == 3 - slots["used"]
        assert info["capacity"]["memory_mb"]["total"] > 0 and info["defaults"]["memory_mb"] > 0
        made = [support.create(n)["id"] for _ in range(slots["free"])]
        try:
            assert all(i.startswith("sbx-loop1-") for i in made)
            full = n.post("/v1/sandboxes", json={})
            assert full.status_code == 409 and full.json()["error"]["code"] == "capacity_exceeded", full.text
            with gateway.client() as g:  # and the gateway, knowing it, does not try
                assert support.wait_for(lambda: g.get("/v1/nodes").json()["nodes"][0]["capacity"]["sandboxes"]["free"] == 0, 10)
                r = g.post("/v1/sandboxes", json={})
                assert r.status_code == 503 and "loop1: full (3 sandboxes)" in r.json()["error"]["message"], r.text
        finally:
            for sandbox_id in made:
                n.delete(f"/v1/sandboxes/{sandbox_id}")
        r = n.post("/v1/node/drain", json={"draining": True})
        assert r.status_code == 200 and r.json()["node_id"] == "loop1" and r.json()["draining"] is True
        try:
            refused = n.post("/v1/sandboxes", json={})
            assert refused.status_code == 503 and refused.json()["error"]["reason"] == "draining"
            assert n.get("/v1/info").json()["draining"] is True
            bad = n.post("/v1/node/drain", json={"draining": "yes"})
            assert bad.status_code == 422
        finally:
            n.post("/v1/node/drain", json={"draining": False})
        again = n.post("/v1/sandboxes", json={})
        assert again.status_code == 201, again.text
        n.delete(f"/v1/sandboxes/{again.json()['id']}")


def _drain_cli(target, *args: str) -> "subprocess.CompletedProcess[str]":
    env = support.server_env(target.token)
    return subprocess.run([sys.executable, "-m", "sandbox", "drain", "--url", target.url, *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(support.REPO))


def test_drain_from_the_command_line(node, gateway):
    """`sandbox-kernel drain` on a node, and through a gateway by node id; --undo undoes it."""
    drained = _drain_cli(node)
    try:
        assert drained.returncode == 0 and "node loop1 is draining" in drained.stdout, drained
        with node.client() as n:
            assert n.get("/v1/info").json()["draining"] is True
            assert n.post("/v1/sandboxes", json={}).json()["error"]["reason"] == "draining"
        undone = _drain_cli(gateway, "--node", "loop1", "--undo")
        assert undone.returncode == 0 and "node loop1 takes new sandboxes again" in undone.stdout, undone
        with node.client() as n:
            assert n.get("/v1/info").json()["draining"] is False
        via_gateway = _drain_cli(gateway, "--node", "loop1")
        assert via_gateway.returncode == 0 and "node loop1 is draining" in via_gateway.stdout, via_gateway
        with node.client() as n:
            assert n.get("/v1/info").json()["draining"] is True
        unknown = _drain_cli(gateway, "--node", "nope")
        assert unknown.returncode == 1 and "no node 'nope'" in unknown.stderr and "Traceback" not in unknown.stderr, unknown
    finally:  # through the gateway, which then knows at once (not at its next refresh)
        _drain_cli(gateway, "--node", "loop1", "--undo")


def test_a_node_that_stops_answering_is_unavailable_then_gone(gateway, node):
    """Last in this module: it stops the node."""
    with gateway.client() as c:
        sandbox_id = support.create(c)["id"]
        assert support.ok(support.execute(c, sandbox_id, "1"))
        streamed: dict = {}

        def long_cell() -> None:
            with gateway.client() as g:
                streamed["events"] = support.execute(g, sandbox_id, "import time; print('on', flush=True); time.sleep(120)")

        runner = threading.Thread(target=long_cell)
        runner.start()
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sandbox_id}").json().get("executing"), 30)
        node.proc.send_signal(signal.SIGSTOP)  # alive but silent: connections open, nothing answers
        try:
            # A call made as it goes silent is answered, not left waiting on it.
            r = c.get(f"/v1/sandboxes/{sandbox_id}")
            assert r.status_code in (503, 410) and r.json()["error"]["reason"] in ("node_unavailable", "node_gone"), r.text
            # The cell's stream does not hang on the silent node: it ends, saying why.
            runner.join(60)
            assert not runner.is_alive(), "the execute stream hung on a silent node"
            events = streamed["events"]
            # ('on' may or may not have left the node before it stopped: not checked)
            assert support.of_type(events, "error")[-1]["ename"] == "NodeUnavailable"
            done = support.done_of(events)
            assert done["status"] == "error" and done["reason"] == "node_unavailable", events
            first = support.wait_for(lambda: c.get(f"/v1/sandboxes/{sandbox_id}").status_code != 200, 20)
            r = c.get(f"/v1/sandboxes/{sandbox_id}")
            assert r.status_code in (503, 410), r.text
            assert first
            gone = support.wait_for(lambda: c.get(f"/v1/sandboxes/{sandbox_id}").status_code == 410, 20)
            r = c.get(f"/v1/sandboxes/{sandbox_id}")
            assert gone, r.text
            assert r.json()["error"]["reason"] == "node_gone" and "the node loop1 is gone" in r.json()["error"]["message"]
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 503 and "loop1" in r.json()["error"]["message"], r.text
            listed = c.get("/v1/sandboxes").json()
            assert listed["sandboxes"] == [] and [u["node_id"] for u in listed["nodes_unavailable"]] == ["loop1"]
        finally:
            node.proc.send_signal(signal.SIGCONT)
        # Back: routed again.
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sandbox_id}").status_code == 200, 20)
        c.delete(f"/v1/sandboxes/{sandbox_id}")


def test_dns_discovery_reads_a_and_aaaa_records():
    zone = Zone()
    try:
        async def lookups():
            nodes = DnsNodes("nodes.test", 8765, zone.server_arg, timeout=2)
            zone.records["nodes.test"] = ["10.0.0.2", "10.0.0.1", "fd00::5"]
            first = await nodes.addresses()
            zone.records["nodes.test"] = ["10.0.0.1"]
            second = await nodes.addresses()
            zone.close()  # the resolver goes away: the last answer stands
            third = await nodes.addresses()
            missing = await DnsNodes("other.test", 8765, f"127.0.0.1:{support.free_port()}", timeout=0.5).addresses()
            return [[t.url for t in found] for found in (first, second, third, missing)]

        first, second, third, missing = asyncio.run(lookups())
        assert first == ["http://10.0.0.1:8765", "http://10.0.0.2:8765", "http://[fd00::5]:8765"]
        assert second == ["http://10.0.0.1:8765"]
        assert third == second
        assert missing == []
    finally:
        zone.close()


def private_dirs(pid: int) -> list[str]:
    import glob
    import tempfile

    return glob.glob(os.path.join(tempfile.gettempdir(), f"sbk-gateway-{pid}-*"))


def test_a_killed_gateways_private_directory_is_removed_by_the_next_gateway(new_gateway):
    """SIGKILL leaves the app's socket directory (the gateway cannot clean up); the next
    gateway on the host removes it, and keeps a live gateway's and another user's."""
    live, killed = new_gateway("live"), new_gateway("killed")
    foreign = None
    if os.geteuid() == 0:  # another user's directory: made with chown, which needs root
        foreign = os.path.join(os.path.dirname(private_dirs(live.proc.pid)[0]), "sbk-gateway-999999999-foreign")
        os.mkdir(foreign)
        os.chown(foreign, 65534, 65534)
    else:
        print("\nnot root: no other user's directory can be made here; that one is kept is checked as root")
    try:
        left = private_dirs(killed.proc.pid)
        assert len(left) == 1, left
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
        assert os.path.isdir(left[0]), "SIGKILL left nothing: the test no longer shows the leftover"
        new_gateway("next").stop()
        assert not os.path.exists(left[0])
        assert len(private_dirs(live.proc.pid)) == 1 and (foreign is None or os.path.isdir(foreign))
    finally:
        live.stop()
        if foreign:
            os.rmdir(foreign)
    assert not private_dirs(live.proc.pid)  # a gateway stopped by SIGTERM removes its own
