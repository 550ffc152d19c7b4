"""Images to and from a real OCI registry (Debian's docker-registry, started here on a free
loopback port with its own storage; plain HTTP, which only a loopback test registry uses):
`sandbox-kernel image push` from one state directory, `image pull --digest` into another,
and a blob altered in the registry's storage refused with nothing imported.

Skipped, with the reason printed, where docker-registry or skopeo is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import support
from oci_registry import NAME, Registry, make_store, stand_in_image, why_not_available
from sandbox.images import registry as image_registry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registry():
    why = why_not_available()
    if why:
        print(f"\nSKIPPED registry tests: {why}")
        pytest.skip(why)
    r = Registry()
    yield r
    r.close()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sandbox", "image", *args], capture_output=True, text=True,
                          cwd=str(support.REPO), timeout=300)


def test_push_then_pull_by_digest_and_a_tampered_blob_is_refused(registry, tmp_path):
    source = make_store(tmp_path / "node-a")
    stand_in_image(source)
    pushed = cli("push", NAME, "--registry", registry.setting, "--state-dir", source.state.root)
    assert pushed.returncode == 0, pushed.stderr
    digest = pushed.stdout.split()[-1]
    assert image_registry.digests(source) == {NAME: digest}
    manifest = registry.manifest(f"{image_registry.REPOSITORY}/{NAME}", digest)
    layer = manifest["layers"][0]["digest"]
    assert registry.blob_file(layer).is_file()

    # Control: the untouched image pulls, by the digest the push printed, tree and all.
    dest = make_store(tmp_path / "node-b")
    pulled = cli("pull", NAME, "--registry", registry.setting, "--digest", digest, "--state-dir", dest.state.root)
    assert pulled.returncode == 0, pulled.stderr
    assert digest in pulled.stdout
    marker = os.path.join(dest.path(NAME), "venv", "lib", "marker.py")
    assert open(marker).read() == "VALUE = 'from the source node'\n"
    assert image_registry.digests(dest) == {NAME: digest}

    # The layer altered in the registry's storage: refused, nothing imported.
    registry.tamper(layer)
    victim = make_store(tmp_path / "node-c")
    refused = cli("pull", NAME, "--registry", registry.setting, "--digest", digest, "--state-dir", victim.state.root)
    assert refused.returncode == 1
    assert "digest" in refused.stderr.lower(), refused.stderr
    assert "Traceback" not in refused.stderr
    assert victim.get(NAME) is None
    assert not os.path.exists(victim.path(NAME))
    assert [n for n in os.listdir(victim.state.images) if not n.startswith(".") or n.startswith((".pull-", ".import-"))] == []


def test_bad_registry_and_digest_arguments_are_refused_clearly(registry, tmp_path):
    store = make_store(tmp_path / "node")
    stand_in_image(store)
    bad = cli("push", NAME, "--registry", "not a registry/x", "--state-dir", store.state.root)
    assert bad.returncode == 1 and "is not host[:port]" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("pull", NAME, "--registry", registry.setting, "--digest", "sha256:abc", "--state-dir", store.state.root)
    assert bad.returncode == 1 and "is not a sha256 digest" in bad.stderr
    missing = cli("pull", "absent", "--registry", registry.setting, "--state-dir", store.state.root)
    assert missing.returncode == 1 and "skopeo copy failed" in missing.stderr and "Traceback" not in missing.stderr


def test_the_server_routes_refuse_without_a_registry(api):
    """A node without image_registry says so (JSON 400), and a malformed digest is a 422."""
    r = api.post("/v1/images/default/pull", json={})
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_registry", r.text
    assert "image_registry" in r.json()["error"]["message"]
    r = api.post("/v1/images/default/pull", json={"digest": "sha256:nothex"})
    assert r.status_code == 422, r.text
    r = api.post("/v1/images/default/push")
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_registry", r.text
