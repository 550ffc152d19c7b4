"""The gVisor tier's warm pool (``gvisor_pool_size``): a gVisor create claims a sandbox
booted ahead of need, and what it claims is fresh: nothing of the previous tenant's state
(variables, files, processes), a workspace, uid and cgroup of its own. Pooled sandboxes are
counted in ``/v1/info`` like the bwrap pool's and hidden from listings until claimed.

Each test's control runs the same probe where the state does exist (the first tenant's own
sandbox), so a probe that could not see it would fail there.
"""

from __future__ import annotations

import pytest

import support

pytestmark = pytest.mark.slow

PROBE = ("import os\n"
         "print(repr((globals().get('secret'), os.path.exists('/workspace/left-by-a'), os.getuid())))")


@pytest.fixture(scope="module")
def pooled(image_source):
    """A server keeping one warm gVisor sandbox (and no bwrap ones)."""
    server = support.own_server(image_source, "--set", "gvisor_pool_size=1", "--set", "pool_preload=false")
    server.open()
    yield server
    server.close()


@pytest.fixture
def client(pooled):
    with pooled.client(timeout=180) as c:
        yield c


def gvisor_ready(client) -> int:
    return client.get("/v1/info").json()["pool"].get("default", {}).get("gvisor", {}).get("ready", 0)


def test_a_gvisor_create_claims_a_fresh_pooled_sandbox(client, pooled):
    assert support.wait_for(lambda: gvisor_ready(client) == 1, 180), client.get("/v1/info").json()["pool"]
    assert client.get("/v1/sandboxes").json()["sandboxes"] == [], "a pooled sandbox is nobody's: not listed"
    a = support.create(client, isolation="gvisor")
    assert a["from_pool"] is True and a["isolation"]["backend"] == "gvisor", a
    support.ok(support.execute(client, a["id"], "secret = 'of tenant a'\n"
                                                "open('/workspace/left-by-a', 'w').write('a')"))
    control = support.stream_text(support.ok(support.execute(client, a["id"], PROBE)))
    assert "'of tenant a', True" in control, control  # the probe sees the state where it is
    a_dir = support.sandbox_dir(pooled, a["id"])

    assert support.wait_for(lambda: gvisor_ready(client) == 1, 180), "the pool refilled after the claim"
    b = support.create(client, isolation="gvisor")
    assert b["from_pool"] is True and b["id"] != a["id"], b
    seen = support.stream_text(support.ok(support.execute(client, b["id"], PROBE)))
    assert "None, False" in seen, seen
    b_dir = support.sandbox_dir(pooled, b["id"])
    assert (b_dir / "spec.json").exists() and b_dir != a_dir
    assert b["isolation"]["host_uid"] != a["isolation"]["host_uid"], (a["isolation"], b["isolation"])
    # its own processes: none of a's runsc container runs under b's directory, and b's own do
    assert support.processes_of(b_dir, [b["id"]]) and not set(support.processes_of(a_dir, [a["id"]])) & set(
        support.processes_of(b_dir, [b["id"]]))
    listed = {s["id"] for s in client.get("/v1/sandboxes").json()["sandboxes"]}
    assert listed == {a["id"], b["id"]}, listed
    for sid in (a["id"], b["id"]):
        assert client.delete(f"/v1/sandboxes/{sid}").status_code in (200, 204)


def test_a_create_the_pool_cannot_serve_boots_its_own(client):
    assert support.wait_for(lambda: gvisor_ready(client) == 1, 180)
    own = support.create(client, isolation="gvisor", on_idle="pause")  # a pooled one ends when idle
    assert own["from_pool"] is False, own
    assert gvisor_ready(client) == 1, "the pooled sandbox was left for another create"
    bwrap = support.create(client)  # the bwrap tier has no pool on this server
    assert bwrap["from_pool"] is False and bwrap["isolation"]["backend"] == "bwrap", bwrap
    for sid in (own["id"], bwrap["id"]):
        client.delete(f"/v1/sandboxes/{sid}")
