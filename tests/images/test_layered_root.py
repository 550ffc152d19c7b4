"""An image layered on another image's root of its own (``--base``): its Debian and pip
packages added through an overlay, its root the base's shared by hard links. The base is
neither rebuilt nor changed: its record, its tree and what its sandboxes see stay as they
were; the layered image has the base's packages and its own, and its SBOM names both.

The base is the run's shared own-root image (tests/own_root_image.py); the layer is built
afresh under a name of this run (about 20 s here) so that its build log is this build's,
and removed at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid

import pytest

import support
import testrun

from own_root_image import NAME as BASE, build_and_lend, own_root_image, tier  # noqa: F401 (the shared build, tiers)

# the first test of a run builds the shared image(s): minutes on 2 shared cores with cold caches
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

LAYER = {"base": BASE, "apt": ["jq"], "pip": ["tabulate"]}


def base_state(images_dir: str) -> dict:
    """What must not change in the base: its record's bytes, and its root's every entry
    (path, type and mode, size, modification time, inode, a file's content)."""
    image = os.path.join(images_dir, BASE)
    with open(os.path.join(image, "image.json"), "rb") as f:
        record = hashlib.sha256(f.read()).hexdigest()
    tree = hashlib.sha256()
    root = os.path.join(image, "root")
    for where, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(where, name)
            st = os.lstat(path)
            tree.update(f"{os.path.relpath(path, root)}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0"
                        f"{st.st_ino}\0".encode())
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    tree.update(hashlib.file_digest(f, "sha256").digest())
    return {"record": record, "tree": tree.hexdigest()}


@pytest.fixture(scope="module")
def layered(sandbox_server, own_root_image):
    """The layer built on the base now (the base's state taken before and after), known
    to the session server; removed from both afterwards."""
    from sandbox.common.paths import StateDir
    from sandbox.images.images import ImageStore

    home = testrun.image_home()
    name = f"layer-{uuid.uuid4().hex[:8]}"
    before = base_state(str(home / "images"))
    info, log = build_and_lend(sandbox_server, name, LAYER)
    yield {"info": info, "log": log, "name": name, "before": before, "after": base_state(str(home / "images"))}
    for state in (sandbox_server.state_dir, home):
        image_json = state / "images" / name / "image.json"
        if state == home:
            ImageStore(StateDir(str(home))).remove(name, in_use=lambda _: 0)
        elif image_json.exists():
            image_json.unlink()
            (state / "images" / name).rmdir()


def test_control_the_base_state_sees_a_write_through_a_hard_link(tmp_path):
    """The probe fires: a file of the base rewritten in place through a hard link (what a
    tool run on a linked copy without the overlay could do), its size and time kept, changes
    the base's state."""
    root = tmp_path / BASE / "root"
    (root / "usr").mkdir(parents=True)
    (tmp_path / BASE / "image.json").write_text("{}")
    (root / "usr" / "file").write_text("base")
    os.link(root / "usr" / "file", tmp_path / "linked")
    before, kept = base_state(str(tmp_path)), os.stat(root / "usr" / "file")
    with open(tmp_path / "linked", "r+") as f:
        f.write("BASE")
    os.utime(root / "usr" / "file", ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert base_state(str(tmp_path)) != before


def shell(api, sandbox_id: str, script: str) -> str:
    events = support.stream_events(api, "POST", f"/v1/sandboxes/{sandbox_id}/commands", json={"shell": script})
    return "".join(e.get("text", "") for e in events if e["type"] == "stream")


def test_the_layer_was_built_on_the_base_without_rebuilding_it(layered, own_root_image):
    log = layered["log"]
    assert f"on the root of image '{BASE}' (shared, not rebuilt)" in log, log
    assert "mmdebstrap" not in log and "the Debian root" not in log, log
    assert layered["after"] == layered["before"]  # the base's record and every entry of its root
    info = layered["info"]
    assert info["base"] == BASE and info["base_hash"] == own_root_image["hash"] and info["root"] == "debian"
    print(f"layer: built in {info['build_seconds']} s, {info['size_bytes'] / 2**20:.1f} MiB of its own "
          f"(the base: {own_root_image['size_bytes'] / 2**20:.0f} MiB)")
    assert info["size_bytes"] < own_root_image["size_bytes"] / 10  # its size is what it adds, not the base's again


def test_the_layer_shares_the_base_root_by_hard_links(layered, own_root_image):
    base_root = next(m["tree"] for m in own_root_image["mounts"] if m["path"] == "/")
    layer_root = next(m["tree"] for m in layered["info"]["mounts"] if m["path"] == "/")
    assert base_root != layer_root
    files = shared = 0
    for where, _, names in os.walk(base_root):
        for name in names:
            path = os.path.join(where, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            files += 1
            twin = os.path.join(layer_root, os.path.relpath(path, base_root))
            shared += os.path.isfile(twin) and os.stat(twin).st_ino == os.stat(path).st_ino
    print(f"{shared} of the base's {files} files shared by the layer")
    assert shared > 0.95 * files, (shared, files)
    assert os.stat(f"{base_root}/usr/bin/node").st_ino == os.stat(f"{layer_root}/usr/bin/node").st_ino
    # what the layer installed is its own: dpkg's database (rewritten by apt) is a new file
    status = "var/lib/dpkg/status"
    assert os.stat(os.path.join(base_root, status)).st_ino != os.stat(os.path.join(layer_root, status)).st_ino
    assert not os.path.exists(os.path.join(base_root, "usr/bin/jq"))


def test_a_sandbox_of_the_layer_has_both_layers_packages(api, new_sandbox, layered, tier):
    sbx = new_sandbox(image=layered["name"], isolation=tier)
    out = shell(api, sbx["id"], "echo '{\"n\": 42}' | jq .n; node -e 'console.log(require(\"left-pad\")(\"7\", 3, \"0\"))'; "
                                "gcc --version >/dev/null && echo gcc")
    assert out.split() == ["42", "007", "gcc"], out
    events = support.ok(support.execute(api, sbx["id"], "import six, tabulate; print('py', six.__name__, tabulate.__name__)"))
    assert "py six tabulate" in "".join(e.get("text", "") for e in events if e["type"] == "stream"), events


def test_control_a_sandbox_of_the_base_has_neither_of_the_layers_packages(api, new_sandbox, layered, own_root_image):
    """The same probes on the base: they tell the layer's packages apart (the host's own jq,
    /usr/bin/jq here, is not visible on a root of its own)."""
    sbx = new_sandbox(image=own_root_image["name"], isolation="bwrap")
    out = shell(api, sbx["id"], "command -v jq || echo no-jq; node -e 'console.log(1)'")
    assert out.split() == ["no-jq", "1"], out
    events = support.execute(api, sbx["id"], "import tabulate")
    assert support.done_of(events)["status"] == "error", events


def test_the_sbom_lists_both_layers(layered, own_root_image):
    from sandbox.images import image_packages

    bom = json.loads(image_packages.sbom(layered["info"]))
    image_of = {c["purl"].split("@")[0]: {p["name"]: p["value"] for p in c.get("properties", [])}.get(
        "sandbox-kernel:image") for c in bom["components"]}
    assert image_of["pkg:deb/debian/jq"] == layered["name"] and image_of["pkg:pypi/tabulate"] == layered["name"]
    assert image_of["pkg:deb/debian/nodejs"] == BASE and image_of["pkg:npm/left-pad"] == BASE
    assert image_of["pkg:pypi/six"] == BASE
    meta = {p["name"]: p["value"] for p in bom["metadata"]["component"]["properties"]}
    assert meta == {"sandbox-kernel:base": BASE, "sandbox-kernel:base-hash": own_root_image["hash"]}


def test_the_same_layer_again_is_reused(layered, sandbox_server):
    """Content-addressed: the same recipe on the same base build is the image there is."""
    _, log = build_and_lend(sandbox_server, layered["name"], LAYER)
    assert "already built from this recipe; reusing it" in log, log
