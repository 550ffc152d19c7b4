"""Images on a root of their own: Debian packages (mmdebstrap), npm packages (the root's own
npm) and pip packages (uv into the root's python3), and sandboxes that see that root as `/`
on both tiers, so that nothing of the host's /usr is visible in them.

One build per run, shared with the polyglot notebook's test: tests/own_root_image.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

import support

from own_root_image import RECIPE, own_root_image, tier  # noqa: F401 (the run's shared build, the tiers)

pytestmark = pytest.mark.slow


def command(api, sandbox_id: str, **body) -> tuple[dict, str]:
    events = support.stream_events(api, "POST", f"/v1/sandboxes/{sandbox_id}/commands", json=body)
    text = "".join(e.get("text", "") for e in events if e["type"] == "stream")
    return events[-1], text


def test_the_build_lists_every_kind_of_package(own_root_image):
    listed = {(p.get("ecosystem"), p["name"]): p for p in own_root_image["package_list"]}
    assert own_root_image["root"] == "debian" and own_root_image["base"] is None
    for name in RECIPE["apt"] + ["python3", "libc6"]:
        assert ("deb", name) in listed, name
    assert listed[("deb", "gcc")]["requested"] and not listed[("deb", "libc6")]["requested"]
    assert ("npm", "left-pad") in listed and listed[("npm", "left-pad")]["licenses"] == ["WTFPL"]
    assert ("pypi", "six") in listed and ("pypi", "ipython") in listed
    # a machine-readable Debian copyright file gives the licences
    assert any(listed[("deb", name)]["licenses"] for name in ("libc6", "nodejs", "gcc"))


def test_the_sbom_names_nodejs_and_the_npm_and_pip_packages(own_root_image, tmp_path):
    from sandbox.images import image_packages

    bom = json.loads(image_packages.sbom(own_root_image))
    purls = {c["purl"].split("@")[0] for c in bom["components"]}
    assert "pkg:deb/debian/nodejs" in purls and "pkg:npm/left-pad" in purls and "pkg:pypi/six" in purls
    nodejs = next(c for c in bom["components"] if c["purl"].startswith("pkg:deb/debian/nodejs@"))
    assert nodejs["version"] and nodejs.get("licenses")


def test_node_gcc_bash_and_python_run_in_the_image_on_each_tier(api, new_sandbox, own_root_image, tier):
    sbx = new_sandbox(image=own_root_image["name"], isolation=tier)
    end, out = command(api, sbx["id"], shell="printf 'console.log(require(\"left-pad\")(\"7\", 3, \"0\")); "
                                             "process.exit(4)' > main.js && node main.js")
    assert out.strip() == "007" and end["exit_code"] == 4, (end, out)
    end, out = command(api, sbx["id"], shell="printf '#include <stdio.h>\\nint main(void){puts(\"c ok\");return 5;}' "
                                             "> m.c && gcc m.c -o m && ./m")
    assert out.strip() == "c ok" and end["exit_code"] == 5, (end, out)
    events = support.execute(api, sbx["id"], "import six, subprocess\n"
                                             "r = subprocess.run(['bash', '-c', 'echo $BASH_VERSION; exit 6'])\n"
                                             "print(six.__name__, r.returncode)")
    text = "".join(e.get("text", "") for e in events if e["type"] == "stream")
    assert "six 6" in text, events


def test_bun_runs_in_the_image_on_each_tier(api, new_sandbox, own_root_image, tier):
    """Bun, the other JavaScript runtime, from its npm package (which carries the binary):
    a script with an npm package, its exit code, and no network."""
    sbx = new_sandbox(image=own_root_image["name"], isolation=tier)
    end, out = command(api, sbx["id"], shell="printf 'console.log(require(\"left-pad\")(String(6 * 7), 4, \"0\")); "
                                             "process.exit(5)' > b.js && bun b.js", timeout_seconds=120)
    assert out.strip() == "0042" and end["exit_code"] == 5, (end, out)
    end, out = command(api, sbx["id"], argv=["bun", "-e", "fetch('http://deb.debian.org').then(() => "
                                             "console.log('reached')).catch(e => console.log('refused', e.code))"],
                       timeout_seconds=120)
    assert "reached" not in out and "refused" in out, (end, out)
    listed = {(p.get("ecosystem"), p["name"]): p for p in own_root_image["package_list"]}
    assert ("npm", "bun") in listed and listed[("npm", "bun")]["version"], listed.get(("npm", "bun"))


NODE_GROWS = ("let kept = []; let n = 0; try { while (true) { kept.push(new Array(1e6).fill(n++)); } } "
              "finally { }")


def test_node_s_heap_ends_inside_the_sandbox_limit_on_each_tier(api, new_sandbox, own_root_image, tier):
    """A script that keeps growing meets V8's own limit, half the sandbox's memory (NODE_OPTIONS,
    runtime_limits.py): node ends with "heap out of memory" and the sandbox lives on, its
    state too. Without it V8 planned about 4 GiB here: the out-of-memory killer ended node,
    and on gVisor the whole sandbox."""
    sbx = new_sandbox(image=own_root_image["name"], isolation=tier)
    support.ok(support.execute(api, sbx["id"], "kept = 41"))
    end, out = command(api, sbx["id"], argv=["node", "-e", NODE_GROWS], timeout_seconds=120)
    # V8 aborts (SIGABRT) with its message; the out-of-memory killer's end would be SIGKILL
    assert end["signal"] == 6 and "heap out of memory" in out, (end, out[-2000:])
    assert end["sandbox_state"] == "running", end
    events = support.ok(support.execute(api, sbx["id"], "print('alive', kept + 1)"))
    assert "alive 42" in "".join(e.get("text", "") for e in events if e["type"] == "stream"), events


def test_no_network_in_the_image(api, new_sandbox, own_root_image, tier):
    sbx = new_sandbox(image=own_root_image["name"], isolation=tier)
    end, out = command(api, sbx["id"], argv=["node", "-e", "require('dns').lookup('deb.debian.org', "
                                                           "(e) => { console.log(e ? 'refused' : 'reached'); "
                                                           "process.exit(e ? 0 : 1) })"])
    assert out.strip() == "refused" and end["exit_code"] == 0, (end, out)


@pytest.fixture
def host_marker():
    """A file the test puts into the host's /usr/local (removed after): a sandbox on the host's
    /usr would see it."""
    path = f"/usr/local/share/sandbox-kernel-marker-{uuid.uuid4().hex}"
    if os.getuid() != 0:
        pytest.skip("putting a marker into the host's /usr/local needs root")
    with open(path, "w") as f:
        f.write("host")
    yield path
    os.unlink(path)


def test_nothing_of_the_host_usr_is_visible_on_an_own_root(api, new_sandbox, own_root_image, tier, host_marker):
    sbx = new_sandbox(image=own_root_image["name"], isolation=tier)
    end, out = command(api, sbx["id"], argv=["sh", "-c", f"test -e {host_marker} && echo visible || echo absent"])
    assert out.strip() == "absent", (end, out)
    # the node that runs is the image's (Debian's nodejs), not the host's
    debian_node = next(p["version"] for p in own_root_image["package_list"]
                       if p.get("ecosystem") == "deb" and p["name"] == "nodejs")
    end, out = command(api, sbx["id"], argv=["node", "--version"])
    assert out.strip().lstrip("v") == debian_node.split("+")[0].split("~")[0], (out, debian_node)
    host_node = shutil.which("node")
    if host_node:  # the comparison tells the two apart only where the host's node is another version
        host_version = subprocess.run([host_node, "--version"], capture_output=True, text=True).stdout.strip()
        if host_version == out.strip():
            pytest.skip(f"the host's node is the image's version too ({host_version}): the check cannot tell them apart")


def test_control_the_marker_is_visible_on_the_host_root(spawn_server, host_marker):
    """The probe fires: a bubblewrap sandbox of the default image on a server that keeps the
    host's /usr (``bwrap_system=host``) sees it. (The gVisor tier has no host-root sandbox to
    compare with: its venv images' pinned root copies a few host files, not /usr/local.)"""
    with spawn_server("--pool-size", "0", "--set", "bwrap_system=host").client(timeout=120) as api:
        sbx = support.create(api, isolation="bwrap")
        end, out = command(api, sbx["id"], argv=["sh", "-c", f"test -e {host_marker} && echo visible || echo absent"])
    assert out.strip() == "visible", (end, out)


def test_a_gvisor_sandbox_on_its_own_root_pauses_and_resumes_with_its_state(api, new_sandbox, own_root_image):
    """The root never changes, so a checkpoint taken on it restores: the interpreter's
    variables and the image's programs are there after a pause and a resume."""
    from sandbox.isolation import gvisor

    ok, why = gvisor.available()
    if not ok:
        pytest.skip(f"gvisor backend unavailable here: {why}")
    sbx = new_sandbox(image=own_root_image["name"], isolation="gvisor")
    support.ok(support.execute(api, sbx["id"], "kept = sum(range(10))"))
    r = api.post(f"/v1/sandboxes/{sbx['id']}/pause")
    assert r.status_code == 200 and r.json()["state"] == "paused", r.text
    r = api.post(f"/v1/sandboxes/{sbx['id']}/resume")
    assert r.status_code == 200 and r.json()["state"] == "running", r.text
    assert r.json()["isolation"]["rootfs_path"] == own_root_image["mounts"][0]["tree"], r.json()["isolation"]
    events = support.execute(api, sbx["id"], "import subprocess\n"
                                             "print(kept, subprocess.run(['node', '-e', 'process.exit(7)']).returncode)")
    assert "45 7" in "".join(e.get("text", "") for e in events if e["type"] == "stream"), events
