"""Images move between hosts through a real OCI registry: a node pushes an image it has, and
a gateway that places a sandbox on a node lacking that image has the node pull it (by the
digest the first node published) before the create; a blob altered in the registry is
refused and nothing is imported.

Two node servers and a gateway, each on its own host (network namespace); the registry
(Debian's docker-registry, its own storage) listens on the test's address on their bridge,
over plain HTTP (``image_registry=http://...``). The images are real ones built here on
node1's state directory from a wheel made by the test, holding a value only this run knows:
a sandbox on node2 that prints it ran on the image node1 pushed.

Skipped, with the reason printed, without network namespaces or without docker-registry
and skopeo.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import secrets
import shutil
import tempfile
import typing as t
import zipfile

import pytest

import support
import netns_hosts as hosts
import oci_registry
from gateway_cluster import Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GATEWAY_ARGS = ("--refresh-seconds", "0.5", "--node-timeout-seconds", "2")


def make_wheel(directory: pathlib.Path, module: str, value: str) -> str:
    """A pure-Python wheel holding ``module.VALUE = value``: installable with no index."""
    dist = f"{module}-1.0.dist-info"
    files = {f"{module}/__init__.py": f"VALUE = {value!r}\n".encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{dist}/RECORD,,\n"
    path = directory / f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            whl.writestr(name, data)
    return str(path)


@pytest.fixture(scope="module")
def setup(sandbox_server: support.Server) -> t.Iterator[tuple[Cluster, oci_registry.Registry]]:
    why = hosts.why_not_available() or oci_registry.why_not_available()
    if why:
        print(f"\nSKIPPED image registry tests: {why}")
        pytest.skip(why)
    if sandbox_server.external:
        pytest.skip("the nodes borrow the session server's images, which are on another host")
    net = hosts.Network().open()
    work = pathlib.Path(tempfile.mkdtemp(prefix="sbk-mh-reg-"))
    registry = None
    c = Cluster(net, secrets.token_hex(16), sandbox_server.state_dir, work)
    try:
        registry = oci_registry.Registry(net.gateway_address)
        for node_id in ("node1", "node2"):
            c.add_node(node_id, "--pool-size", "1", "--set", f"image_registry={registry.setting}")
        c.add_gateway("gw1", *(f"--node=http://{n.host.address}:8765" for n in c.nodes), *GATEWAY_ARGS)
        yield c, registry
    except BaseException:
        print(c.logs())
        if registry is not None:
            print(registry.log_tail())
        raise
    finally:
        c.close()
        if registry is not None:
            registry.close()
        shutil.rmtree(work, ignore_errors=True)


def build_on(node, name: str, work: pathlib.Path) -> str:
    """Build image ``name`` on a node's state directory from a wheel of a fresh value; the value."""
    from sandbox.common.paths import StateDir
    from sandbox.images.images import ImageStore

    value = secrets.token_hex(8)
    wheel_dir = work / name
    wheel_dir.mkdir()
    wheel = make_wheel(wheel_dir, f"sbk_{name}", value)
    ImageStore(StateDir(str(node.state_dir))).build(name, pip=[wheel], preload=[], progress=lambda line: None)
    return value


def push(node, name: str) -> str:
    with node.client(timeout=300) as c:
        r = c.post(f"/v1/images/{name}/push")
    assert r.status_code == 200, r.text
    return r.json()["digest"]


def leftovers(node, name: str) -> list[str]:
    images = node.state_dir / "images"
    return [n for n in os.listdir(images) if n == name or n.startswith((".pull-", ".import-"))]


def test_a_node_pulls_the_image_another_pushed_before_its_sandbox_is_placed(setup):
    cluster, registry = setup
    node1, node2 = cluster.nodes
    gw = cluster.gateways[0]
    value = build_on(node1, "carried", cluster.work)
    # node1 takes no new sandbox, so the gateway must place on node2, which lacks the image.
    with node1.client() as c:
        assert c.post("/v1/node/drain", json={"draining": True}).status_code == 200
    with gw.client(timeout=300) as g:
        wait_for(lambda: any(n["node_id"] == "node1" and n["draining"] for n in g.get("/v1/nodes").json()["nodes"]), 30)
        # Control: before node1 published it, no node can take a sandbox of that image.
        r = g.post("/v1/sandboxes", json={"image": "carried"})
        assert r.status_code == 503 and "no image 'carried'" in r.json()["error"]["message"], r.text
        assert leftovers(node2, "carried") == []

        digest = push(node1, "carried")
        assert _published(node1, "carried") == digest
        created = _create_when_seen(g, "carried")
        assert node_of(created["id"]) == "node2", created
        out = support.stream_text(support.ok(support.execute(g, created["id"], "import sbk_carried; print(sbk_carried.VALUE)")))
        assert out == f"{value}\n"
    assert (node2.state_dir / "images" / "carried" / "image.json").is_file()
    with node2.client() as c:
        assert c.get("/v1/info").json()["image_digests"]["carried"] == digest


def test_a_tampered_blob_is_refused_and_nothing_is_imported(setup):
    cluster, registry = setup
    node1, node2 = cluster.nodes
    gw = cluster.gateways[0]
    build_on(node1, "tampered", cluster.work)
    with node1.client() as c:
        c.post("/v1/node/drain", json={"draining": True})
    digest = push(node1, "tampered")
    manifest = registry.manifest("sandbox-kernel/tampered", digest)
    registry.tamper(manifest["layers"][0]["digest"])
    with gw.client(timeout=300) as g:
        assert _published(node1, "tampered") == digest
        r = _create_when_seen(g, "tampered", expect_ok=False)
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "pulling image 'tampered'" in message and "digest" in message.lower(), message
    assert leftovers(node2, "tampered") == []


def node_of(sandbox_id: str) -> str | None:
    from sandbox.common.ids import node_of as parse

    return parse(sandbox_id)


def _published(node, name: str) -> str | None:
    with node.client() as c:
        return c.get("/v1/info").json().get("image_digests", {}).get(name)


def _create_when_seen(g, image: str, expect_ok: bool = True):
    """Create once the gateway's view of the nodes holds the digest (its refresh is 0.5 s):
    until then it answers "no image"."""
    def attempt():
        r = g.post("/v1/sandboxes", json={"image": image})
        if r.status_code == 503 and f"no image {image!r}" in r.json()["error"]["message"]:
            return None
        return r
    r = wait_for(attempt, 30)
    assert r is not None, f"the gateway never saw image {image!r} published"
    if not expect_ok:
        return r
    assert r.status_code == 201, r.text
    return r.json()
