"""Forks of gVisor sandboxes: one checkpoint restored as a second, independent sandbox.

The state a fork must carry is what only the live interpreter holds (a variable, a
generator half consumed: its frame exists nowhere but in memory) and what the workspace
holds (a file). After the fork the two must diverge: a change in one is not seen by the
other, in memory or on disk.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

import support
from sandbox.common import statefile
from sandbox.client import Sandbox
from sandbox.isolation import workspace_store

SETUP = """
x = 41
g = (i * i for i in range(10))
first = [next(g), next(g)]
open("kept.txt", "w").write("written before the fork")
"""
LOOK = "import json; print(json.dumps({'x': x, 'next': next(g), 'file': open('kept.txt').read()}))"
BEFORE = "written before the fork"


def look(client, sandbox_id: str) -> dict:
    return json.loads(support.stream_text(support.ok(support.execute(client, sandbox_id, LOOK))))


def fork(client, sandbox_id: str, **fields) -> dict:
    r = client.post(f"/v1/sandboxes/{sandbox_id}/fork", json=fields)
    assert r.status_code == 201, r.text
    return r.json()


def test_a_fork_carries_the_state_and_then_goes_its_own_way(api, new_sandbox, sandbox_server):
    source = new_sandbox(isolation="gvisor")
    sid = source["id"]
    support.ok(support.execute(api, sid, SETUP))

    made = fork(api, sid, ttl_seconds=900, metadata={"attempt": "b"})
    fid = made["id"]
    try:
        assert fid != sid and made["forked_from"] == sid and made["state"] == "running", made
        assert made["ttl_seconds"] == 900 and made["metadata"] == {"attempt": "b"}, made
        assert made["limits"] == source["limits"] and made["isolation"]["backend"] == "gvisor", made
        # The source is restored after the fork answered, by itself (no call needed to wake it).
        assert support.wait_for(lambda: api.get(f"/v1/sandboxes/{sid}").json()["state"] == "running", 180)

        # Both hold the variable, the generator where it was, and the file.
        assert look(api, sid) == {"x": 41, "next": 4, "file": BEFORE}
        assert look(api, fid) == {"x": 41, "next": 4, "file": BEFORE}

        # They diverge: the fork's changes stay in the fork, the source's in the source.
        support.ok(support.execute(api, fid, "x = 100; open('kept.txt', 'w').write('changed in the fork')"))
        assert look(api, sid) == {"x": 41, "next": 9, "file": BEFORE}
        assert look(api, fid) == {"x": 100, "next": 9, "file": "changed in the fork"}
        support.ok(support.execute(api, sid, "x = 7; open('only-in-source.txt', 'w').write('s')"))
        assert look(api, fid)["x"] == 100
        assert api.get(f"/v1/sandboxes/{fid}/files/only-in-source.txt").status_code == 404
        assert api.get(f"/v1/sandboxes/{sid}/files/only-in-source.txt").status_code == 200

        # A paused source stays paused; its fork (here through the client) starts from the checkpoint.
        r = api.post(f"/v1/sandboxes/{sid}/pause")
        assert r.status_code == 200 and r.json()["state"] == "paused", r.text
        paused_source = Sandbox(sid, url=sandbox_server.url, token=sandbox_server.token)
        forked = paused_source.fork(metadata={"attempt": "c"})
        second = forked.id
        paused_source.close()
        forked.close()
        assert forked.info.forked_from == sid and forked.info.metadata == {"attempt": "c"}, forked.info
        try:
            assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
            assert look(api, second) == {"x": 7, "next": 16, "file": BEFORE}
        finally:
            api.delete(f"/v1/sandboxes/{second}")
        assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        assert look(api, sid) == {"x": 7, "next": 16, "file": BEFORE}  # still its own, restored on call
    finally:
        api.delete(f"/v1/sandboxes/{fid}")


def test_a_fork_inherits_its_sources_absolute_lifetime(api, new_sandbox):
    """Red team: fork a sandbox asking for a longer life, then fork the fork. The state is the
    source's, so each fork ends no later than the source's maximum lifetime (else forking
    again and again keeps a sandbox's state alive forever). Control: a fork asking for a
    shorter life gets that, sooner, so the probe reads a field the request does move."""
    source = new_sandbox(isolation="gvisor", max_lifetime_seconds=600)
    sid, end = source["id"], statefile.epoch(source["max_expires_at"])
    support.ok(support.execute(api, sid, "x = 1"))
    made = []
    try:
        longer = fork(api, sid, max_lifetime_seconds=86400)
        made.append(longer["id"])
        again = fork(api, longer["id"], max_lifetime_seconds=86400)
        made.append(again["id"])
        for child in (longer, again):
            assert statefile.epoch(child["max_expires_at"]) <= end + 1, (child["max_expires_at"], source["max_expires_at"])
            assert statefile.epoch(child["expires_at"]) <= end + 1, child
        # Control: a shorter life than the source's is the fork's own.
        shorter = fork(api, sid, max_lifetime_seconds=120)
        made.append(shorter["id"])
        assert statefile.epoch(shorter["max_expires_at"]) < end - 300, (shorter["max_expires_at"], end)
    finally:
        for fid in made:
            api.delete(f"/v1/sandboxes/{fid}")


def test_a_bwrap_sandbox_cannot_fork_and_says_why(api, new_sandbox):
    sid = new_sandbox(isolation="bwrap")["id"]
    support.ok(support.execute(api, sid, "x = 1"))
    before = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
    r = api.post(f"/v1/sandboxes/{sid}/fork", json={})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["reason"] == "not_supported" and "fork needs isolation 'gvisor'" in err["message"], err
    assert {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]} == before  # nothing was made
    assert support.result_text(support.ok(support.execute(api, sid, "x + 1"))) == "2"  # untouched


def test_a_sandbox_running_a_cell_is_not_forked_and_runs_on(api, new_sandbox):
    """The fork's checkpoint is a pause, with its refusals: never mid-cell."""
    sid = new_sandbox(isolation="gvisor")["id"]
    support.ok(support.execute(api, sid, "x = 1"))
    before = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
    cell = threading.Thread(target=support.execute, args=(api, sid, "import time; time.sleep(6); x = 2"))
    cell.start()
    try:
        assert support.wait_for(lambda: api.get(f"/v1/sandboxes/{sid}").json()["executing"], 10)
        r = api.post(f"/v1/sandboxes/{sid}/fork", json={})
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["reason"] == "busy" and "fork needs a checkpoint" in err["message"], err
    finally:
        cell.join()
    assert {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]} == before
    assert support.result_text(support.ok(support.execute(api, sid, "x"))) == "2"  # the cell ran to its end


def test_a_fork_counts_against_the_totals_and_survives_a_server_restart(spawn_server):
    server = spawn_server("--set", "max_sandboxes=2")
    with server.client(timeout=180) as c:
        sid = support.create(c, isolation="gvisor")["id"]
        support.ok(support.execute(c, sid, SETUP))
        fid = fork(c, sid)["id"]
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running", 180)
        r = c.post(f"/v1/sandboxes/{sid}/fork", json={})  # a third sandbox does not fit
        assert r.status_code == 409 and r.json()["error"]["code"] == "capacity_exceeded", r.text
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"  # refused before any pause
        r = c.post(f"/v1/sandboxes/{fid}/pause")
        assert r.status_code == 200, r.text

    server.kill9()  # the running source is re-attached, the paused fork adopted as paused
    server.start()
    with server.client(timeout=180) as c:
        got = c.get(f"/v1/sandboxes/{fid}").json()
        assert got["state"] == "paused" and got["forked_from"] == sid, got
        assert look(c, fid) == {"x": 41, "next": 4, "file": BEFORE}
        assert look(c, sid) == {"x": 41, "next": 4, "file": BEFORE}


def test_a_forks_workspace_shares_its_sources_blocks(api, new_sandbox, sandbox_server):
    """A fork's workspace is a reflink of its source's (the workspace store): the store's
    used space does not grow by the file's size, both read the same bytes, and deleting
    both leaves no image in the store. A plain copy would add the 64 MiB."""
    ok, why = workspace_store.available()
    if not ok:
        pytest.skip(f"no workspace store here: {why}")
    store = sandbox_server.state_dir / workspace_store.STORE
    sid = new_sandbox(isolation="gvisor")["id"]
    made = "import hashlib, os; data = os.urandom(64 << 20); open('big.bin', 'wb').write(data); " \
           "print(hashlib.sha256(data).hexdigest())"
    digest = support.stream_text(support.ok(support.execute(api, sid, made))).strip()
    assert "store whose copies share blocks" in api.get(f"/v1/sandboxes/{sid}").json()["isolation"]["disk"]
    r = api.post(f"/v1/sandboxes/{sid}/pause")
    assert r.status_code == 200, r.text

    before = support.disk_used(store)
    fid = fork(api, sid)["id"]
    try:
        grown = support.disk_used(store) - before
        assert grown < (16 << 20), f"the store grew by {grown >> 20} MiB for a fork of a 64 MiB workspace"
        check = "import hashlib; print(hashlib.sha256(open('big.bin', 'rb').read()).hexdigest())"
        assert support.stream_text(support.ok(support.execute(api, fid, check))).strip() == digest
        support.ok(support.execute(api, fid, "open('big.bin', 'r+b').write(b'fork')"))
        assert support.stream_text(support.ok(support.execute(api, sid, check))).strip() == digest
    finally:
        api.delete(f"/v1/sandboxes/{fid}")
    api.delete(f"/v1/sandboxes/{sid}")
    assert support.wait_for(lambda: not {p.name for p in store.iterdir()} & {f"{sid}.img", f"{fid}.img"}, 30), \
        sorted(p.name for p in store.iterdir())
