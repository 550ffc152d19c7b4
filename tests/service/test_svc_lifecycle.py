"""A sandbox's life through the API: TTL renewal and expiry, the lifetime cap, delete, the
host uid it runs as. Plus the latency numbers the report quotes (printed, not asserted).
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timedelta

import pytest
from support import (
    cmdline,
    create,
    execute,
    ok,
    process_tree,
    real_uid,
    result_text,
    still_running,
    supervisor_pid,
    thread_group,
    wait_for,
)
from svc_support import api_error

from sandbox.images.images import DEFAULT_PRELOAD


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def gone_error(api, sandbox_id: str):
    """The 410 answer of an ended sandbox, or None while it still answers 200."""
    r = api.get(f"/v1/sandboxes/{sandbox_id}")
    if r.status_code == 200:
        return None
    return api_error(r, 410)


def test_ttl_slides_on_execute_and_renew_then_expires(api, new_sandbox, run):
    created = new_sandbox(ttl_seconds=3)
    sid = created["id"]
    assert created["ttl_seconds"] == 3
    first_expiry = ts(created["expires_at"])

    time.sleep(1.5)  # most of the TTL gone, with margin for a loaded CI box
    events = ok(run(sid, "x = 1"))
    after_execute = ts(events[-1]["expires_at"])
    assert after_execute > first_expiry
    assert ts(api.get(f"/v1/sandboxes/{sid}").json()["expires_at"]) == after_execute

    time.sleep(0.5)
    r = api.post(f"/v1/sandboxes/{sid}/renew")
    assert r.status_code == 200, r.text
    after_renew = ts(r.json()["expires_at"])
    assert after_renew > after_execute
    assert r.json()["state"] == "running"

    error = wait_for(lambda: gone_error(api, sid), timeout=20, interval=0.25)
    assert error, "not within 20 s: the idle sandbox to expire"
    assert error["code"] == "gone"
    assert "expired" in error["message"], error
    assert error.get("state") == "expired"
    # it stayed alive at least until the renewed expiry (the expiry is not early)
    assert datetime.now(after_renew.tzinfo) >= after_renew
    assert api_error(api.post(f"/v1/sandboxes/{sid}/execute", json={"code": "x"}), 410)["code"] == "gone"
    assert api_error(api.post(f"/v1/sandboxes/{sid}/renew"), 410)["code"] == "gone"


def test_a_cold_sandboxs_ttl_counts_from_when_it_is_ready(new_sandbox):
    """A sandbox started for the request (not from the warm pool: another disk size) has
    its TTL from when it could take a cell, not from when its boot began: its expiry is
    later than creation plus the TTL by the boot's time. (Counted from the boot's start, a
    short TTL ran out during a slow cold start on a busy host, before the first cell.)"""
    created = new_sandbox(ttl_seconds=600, disk_mb=257)
    assert created["from_pool"] is False, created
    assert ts(created["expires_at"]) - ts(created["created_at"]) > timedelta(seconds=600), created


PRELOADED = f"import sys; sorted(m for m in {tuple(DEFAULT_PRELOAD)!r} if m in sys.modules)"


def claim_warm(client) -> dict:
    """A sandbox claimed from the server's warm pool (once one is ready)."""
    assert wait_for(lambda: client.get("/v1/info").json()["pool"]["default"]["ready"] >= 1, 120), \
        client.get("/v1/info").text
    warm = create(client)
    assert warm["from_pool"] is True, warm
    return warm


def test_only_a_warm_sandbox_has_the_images_modules_preloaded(spawn_server, api):
    """Preloading pays numpy and pandas ahead (not matplotlib: 29 MiB per idle sandbox), while nobody waits: with the
    product's defaults a warm sandbox has them at its first cell. A sandbox started for a
    waiting caller (here: not from the pool, for its disk size) imports nothing ahead (about
    a CPU-second) and imports on first use, a figure then showing inline all the same. With
    `pool_preload=false` (the session server's setting) a warm sandbox imports nothing ahead
    either."""
    with spawn_server("--pool-size", "1").client(timeout=120) as own:
        warm = claim_warm(own)
        assert result_text(ok(execute(own, warm["id"], PRELOADED))) == "['numpy', 'pandas']"
        assert result_text(ok(execute(own, warm["id"], "import sys; 'matplotlib' in sys.modules"))) == "False"
        cold = create(own, disk_mb=257)
        assert cold["from_pool"] is False, cold
        assert result_text(ok(execute(own, cold["id"], PRELOADED))) == "[]"
        events = ok(execute(own, cold["id"], "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nNone"))
        assert [e for e in events if e["type"] == "display_data" and "image/png" in e["data"]], events
    light = claim_warm(api)
    try:
        assert result_text(ok(execute(api, light["id"], PRELOADED))) == "[]"
    finally:
        api.delete(f"/v1/sandboxes/{light['id']}")


def test_a_cell_longer_than_the_ttl_leaves_the_sandbox_alive(api, new_sandbox, run):
    """The TTL counts idle time: an execute renews it when it starts *and when it ends*.
    With the start's renewal alone, a cell longer than the TTL would end with its sandbox
    already past its expiry, and the reaper would end it right after."""
    ttl, cell_seconds = 2, 4
    sid = new_sandbox(ttl_seconds=ttl)["id"]
    sent = datetime.now().astimezone()
    events = ok(run(sid, f"import time\ntime.sleep({cell_seconds})\n'slept'"))
    received = datetime.now().astimezone()
    expires = ts(events[-1]["expires_at"])
    # About the end of the cell plus the TTL: the cell ended after `cell_seconds`, so no
    # earlier than that plus the TTL; and not after the answer came plus the TTL.
    assert expires >= sent + timedelta(seconds=cell_seconds + ttl), (sent, expires)
    assert expires <= received + timedelta(seconds=ttl + 1), (received, expires)
    assert expires > received, "the cell ended with its sandbox already expired"
    body = api.get(f"/v1/sandboxes/{sid}").json()
    assert body["state"] == "running" and ts(body["expires_at"]) == expires, body
    assert result_text(ok(run(sid, "time.sleep(0) or 'still here'"))) == "'still here'"


def test_renew_with_a_new_ttl(api, new_sandbox):
    sid = new_sandbox(ttl_seconds=60)["id"]
    r = api.post(f"/v1/sandboxes/{sid}/renew", json={"ttl_seconds": 600})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ttl_seconds"] == 600
    left = (ts(body["expires_at"]) - datetime.now(ts(body["expires_at"]).tzinfo)).total_seconds()
    assert 500 < left <= 600


def test_max_lifetime_caps_renewals(api, new_sandbox, run):
    t0 = time.monotonic()
    created = new_sandbox(ttl_seconds=30, max_lifetime_seconds=3)
    sid = created["id"]
    cap = ts(created["max_expires_at"])
    assert ts(created["expires_at"]) <= cap
    for _ in range(2):
        time.sleep(0.8)
        r = api.post(f"/v1/sandboxes/{sid}/renew", json={"ttl_seconds": 30})
        assert r.status_code == 200, r.text
        assert ts(r.json()["expires_at"]) <= cap, "a renewal went past the lifetime cap"
    ok(run(sid, "1"))

    error = wait_for(lambda: gone_error(api, sid), timeout=20, interval=0.25)
    assert error, "not within 20 s: the lifetime cap to end the sandbox"
    ended_after = time.monotonic() - t0
    # Ended by the cap (3 s), nowhere near the 30 s TTL that renewals kept pushing.
    assert ended_after < 15, ended_after
    assert error["code"] == "gone"
    assert "maximum lifetime" in error["message"], error


def test_delete_kills_every_process(sandbox_server, api, new_sandbox, run):
    sid = new_sandbox()["id"]
    ok(run(sid, "\n".join([
        "import subprocess, threading, time",
        "child = subprocess.Popen(['sleep', '1000'])",
        # a daemonised grandchild in its own session, reparented inside the sandbox
        "subprocess.run(['sh', '-c', 'setsid sleep 1001 > /dev/null 2>&1 &'])",
        "worker = threading.Thread(target=time.sleep, args=(1000,), daemon=True)",
        "worker.start()",
    ])))
    supervisor = supervisor_pid(sandbox_server, sid)

    def tree_with_both_sleeps():
        tree = process_tree(supervisor)
        commands = [cmdline(pid) for pid in tree]
        return tree if ["sleep", "1000"] in commands and ["sleep", "1001"] in commands else None

    tree = wait_for(tree_with_both_sleeps, timeout=10)
    assert tree, "not within 10 s: both sleeps to show up under the supervisor"
    commands = {pid: cmdline(pid) for pid in tree}
    assert any(c[:2] == ["sleep", "1000"] for c in commands.values()), commands
    assert any(c[:2] == ["sleep", "1001"] for c in commands.values()), commands
    assert any("sandbox_runtime" in c for c in commands.values()), commands
    assert len(tree) >= 6, commands  # supervisor, bwrap (2), runtime + its threads, sleeps

    r = api.delete(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200 and r.json() == {"id": sid, "state": "deleted"}
    assert wait_for(lambda: not any(still_running(pid, start) for pid, start in tree.items()), timeout=10), \
        f"not within 10 s: every process of the deleted sandbox to end: " \
        f"{[p for p, s in tree.items() if still_running(p, s)]}"

    error = api_error(api.get(f"/v1/sandboxes/{sid}"), 410)
    assert error["code"] == "gone" and "deleted" in error["message"], error
    assert api_error(api.delete(f"/v1/sandboxes/{sid}"), 410)["code"] == "gone"
    assert sid not in [s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]]


def test_listing_shows_only_claimed_sandboxes_while_the_pool_refills(api, new_sandbox):
    """A claim makes the pool start a replacement at once; while that one boots it must
    not show up as somebody's sandbox (it used to, with state null, and deleting it took 15 s)."""
    mine = new_sandbox()["id"]
    deadline = time.monotonic() + 3
    seen = set()
    while time.monotonic() < deadline:
        r = api.get("/v1/sandboxes")
        assert r.status_code == 200
        for sbx in r.json()["sandboxes"]:
            assert sbx["state"] == "running", sbx
            assert sbx["created_at"], sbx
            seen.add(sbx["id"])
        time.sleep(0.05)
    assert mine in seen


def test_sandbox_runs_as_non_root(sandbox_server, new_sandbox, run):
    created = new_sandbox()
    sid = created["id"]
    inside = ok(run(sid, "import os\n(os.getuid(), os.geteuid(), os.getgid())"))
    assert result_text(inside) == "(1000, 1000, 1000)"

    supervisor = supervisor_pid(sandbox_server, sid)
    if real_uid(supervisor) != 0:
        pytest.skip("the server does not run as root here, so there is no separate host uid to check "
                    "(its sandboxes run as the server's own uid)")
    tree = process_tree(supervisor)
    runtime = [pid for pid in tree if "sandbox_runtime" in cmdline(pid)]
    assert runtime, {p: cmdline(p) for p in tree}
    host_uid = created["isolation"]["host_uid"]
    assert isinstance(host_uid, int) and host_uid != 0
    sandbox_side = [pid for pid in tree if thread_group(pid) != supervisor]
    assert set(runtime) <= set(sandbox_side)
    for pid in sandbox_side:
        assert real_uid(pid) == host_uid, (pid, cmdline(pid), real_uid(pid))


@pytest.mark.slow
def test_measure_latency(api, run, capsys):
    """Not a benchmark (bench/ is): the numbers this suite saw, for the report."""
    creates, from_pool = [], 0
    for _ in range(10):
        t0 = time.perf_counter()
        r = api.post("/v1/sandboxes", json={})
        creates.append(time.perf_counter() - t0)
        assert r.status_code == 201, r.text
        from_pool += r.json()["from_pool"]
        api.delete(f"/v1/sandboxes/{r.json()['id']}")
    r = api.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        executes = []
        for _ in range(50):
            t0 = time.perf_counter()
            ok(run(sid, "x = 1"))
            executes.append(time.perf_counter() - t0)
    finally:
        api.delete(f"/v1/sandboxes/{sid}")
    with capsys.disabled():
        print(f"\n[latency] create p50 {statistics.median(creates) * 1000:.0f} ms "
              f"(min {min(creates) * 1000:.0f}, max {max(creates) * 1000:.0f}; {from_pool}/10 from the pool); "
              f"execute 'x = 1' p50 {statistics.median(executes) * 1000:.1f} ms "
              f"(min {min(executes) * 1000:.1f}, max {max(executes) * 1000:.1f})")
