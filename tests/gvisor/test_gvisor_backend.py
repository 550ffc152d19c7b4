"""The gvisor backend: a sandbox under gVisor's kernel, on its image's own root filesystem.

Each test compares with a bwrap sandbox on the same server where the difference is the
point (the kernel that answers, the files that are visible), so that a gvisor sandbox that
silently ran under bwrap fails here.
"""

from __future__ import annotations

import json
import os
import socket

import support

HOST_ONLY = ["/usr/bin/runsc", "/usr/bin/apt-get", "/usr/bin/dpkg", "/etc/hostname", "/etc/shadow", "/var/lib/dpkg/status"]

PROBE = """
import json, os, platform
seen = {p: os.path.exists(p) for p in %r}
try:
    open('/usr/lib/sandbox-write-test', 'w')
    ro = False
except OSError:
    ro = True
print(json.dumps({"kernel": open('/proc/version').read().strip(), "seen": seen, "ro": ro, "uid": os.getuid()}))
"""


def probe(api, sandbox_id: str) -> dict:
    events = support.ok(support.execute(api, sandbox_id, PROBE % (HOST_ONLY,)))
    return json.loads(support.stream_text(events))


def test_a_gvisor_sandbox_runs_under_gvisors_kernel_and_keeps_state(api, new_sandbox):
    info = new_sandbox(isolation="gvisor")
    iso = info["isolation"]
    assert iso["backend"] == "gvisor" and iso["platform"] == "ptrace", iso
    assert iso["runsc_version"] and iso["network"].startswith("none"), iso
    assert iso["memory"].startswith("cgroup"), iso  # runsc runs inside the sandbox's cgroup
    got = probe(api, info["id"])
    with open("/proc/version") as f:
        host_kernel = f.read().strip()
    assert got["kernel"] != host_kernel, "the sandbox read the host's /proc/version: not under gVisor"
    assert got["ro"], "the root filesystem is writable"
    control = probe(api, new_sandbox(isolation="bwrap")["id"])
    assert control["kernel"] == host_kernel  # control: bwrap shares the host's kernel, and the probe sees it

    sid = info["id"]
    support.ok(support.execute(api, sid, "import pandas as pd\nx = 41\ndf = pd.DataFrame({'n': [1, 2, 3]})"))
    assert support.result_text(support.ok(support.execute(api, sid, "x + int(df.n.sum())"))) == "47"
    r = api.get(f"/v1/sandboxes/{sid}")
    assert r.json()["isolation"]["backend"] == "gvisor" and r.json()["state"] == "running"


def test_the_root_filesystem_is_the_images_own_not_the_hosts(api, new_sandbox, spawn_server):
    assert all(os.path.exists(p) for p in HOST_ONLY), "control: these exist on the host"
    got = probe(api, new_sandbox(isolation="gvisor")["id"])
    assert not any(got["seen"].values()), got["seen"]
    # control: a bwrap sandbox on the host's /usr (bwrap_system=host; the default is the pinned root)
    with spawn_server("--set", "bwrap_system=host").client(timeout=120) as host_api:
        control = probe(host_api, support.create(host_api, isolation="bwrap")["id"])
    assert control["seen"]["/usr/bin/apt-get"], "control: bwrap on the host's /usr sees it"


def test_no_network_from_a_gvisor_sandbox(api, new_sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        code = f"""
import socket
for host in ("127.0.0.1", "1.1.1.1"):
    try:
        socket.create_connection((host, {port} if host.startswith("127") else 80), timeout=3)
        print(host, "connected")
    except OSError as exc:
        print(host, "refused", exc.errno)
"""
        out = support.stream_text(support.ok(support.execute(api, new_sandbox(isolation="gvisor")["id"], code)))
        assert "connected" not in out, out
        assert out.count("refused") == 2, out
    finally:
        listener.close()


def test_files_and_commands_reach_the_same_workspace(api, new_sandbox):
    sid = new_sandbox(isolation="gvisor")["id"]
    r = api.put(f"/v1/sandboxes/{sid}/files/in.txt", content=b"from the host\n")
    assert r.status_code == 201, r.text
    support.ok(support.execute(api, sid, "open('out.txt', 'w').write(open('in.txt').read().upper())"))
    assert api.get(f"/v1/sandboxes/{sid}/files/out.txt").content == b"FROM THE HOST\n"
    events = support.stream_events(api, "POST", f"/v1/sandboxes/{sid}/commands",
                                   json={"shell": "cat out.txt; exit 3"})
    done = support.done_of(events)
    assert done["exit_code"] == 3 and support.stream_text(events) == "FROM THE HOST\n", events


def test_bad_isolation_and_on_idle_are_refused_with_reasons(api):
    r = api.post("/v1/sandboxes", json={"isolation": "firecracker"})
    assert r.status_code == 422 and "isolation" in r.json()["error"]["message"], r.text
    r = api.post("/v1/sandboxes", json={"isolation": "bwrap", "on_idle": "pause"})
    assert r.status_code == 422 and "gvisor" in r.json()["error"]["message"], r.text
