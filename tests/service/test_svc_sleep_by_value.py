"""Sleep by value on the bwrap tier: a kept notebook's sandbox (its metadata names a
save_label) with no call for ``bwrap_sleep_after_seconds`` is saved by value and its
processes end; its next call starts a new runtime under the same id and loads the save.

Looked at where it lands: the host's process table and cgroup tree (nothing of it left
asleep), the owner's store (the save it sleeps with), the woken namespace (variables, a
lambda by value, the open file named as lost). The control is the same server setting at 0:
the sandbox keeps running, its processes and cgroup there.
"""

from __future__ import annotations

import pytest

from tests import support

pytestmark = pytest.mark.bwrap_only("sleep by value is the bwrap tier's sleep (gVisor sleeps by checkpoint)")

SLEEP_AFTER = 3
NOTEBOOK = """
import numpy as np
rows = np.arange(200_000, dtype=np.float64)
table = {"total": float(rows.sum()), "n": len(rows)}
scale = lambda v: v * 3 + 1
log = open("/workspace/log.txt", "w")
log.write("kept on disk")
log.flush()
"""


def state_of(api, sid: str) -> dict:
    r = api.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


def nothing_left(server: support.Server, sid: str) -> bool:
    return not support.processes_of(support.sandbox_dir(server, sid), [sid]) and not support.cgroup_dirs(sid)


@pytest.mark.slow
def test_an_idle_kept_sandbox_sleeps_by_value_and_its_next_execute_wakes_it(spawn_server):
    server = spawn_server("--set", f"bwrap_sleep_after_seconds={SLEEP_AFTER}")
    with server.client(timeout=300) as api:
        sid = support.create(api, metadata={"save_label": "notebook:sleepy"})["id"]
        support.ok(support.execute(api, sid, NOTEBOOK))
        awake = state_of(api, sid)
        assert awake["state"] == "running" and awake["sleeps_at"], awake
        assert support.cgroup_dirs(sid), "a running sandbox has its cgroup (the probe below can see one)"
        assert support.wait_for(lambda: state_of(api, sid)["state"] == "paused", 90), state_of(api, sid)
        asleep = state_of(api, sid)
        assert asleep["paused_by"] == "idle", asleep
        assert [s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"] if s["id"] == sid] == [sid]
        # its memory freed: no process of it left, its cgroup removed
        assert support.wait_for(lambda: nothing_left(server, sid), 60), (
            support.processes_of(support.sandbox_dir(server, sid), [sid]), support.cgroup_dirs(sid))
        by_value = support.read_state(server, sid)["by_value"]
        saves = api.get("/v1/saves", params={"label": "notebook:sleepy"}).json()["saves"]
        assert [(s["id"], s["by"], s["source_sandbox"]) for s in saves] == [(by_value["save_id"], "sleep", sid)]

        events = support.ok(support.execute(api, sid, "table, scale(2), open('/workspace/log.txt').read(), 'log' in dir()"))
        assert support.result_text(events) == "({'total': 19999900000.0, 'n': 200000}, 7, 'kept on disk', False)", events
        note = support.stream_text(events, "stderr")
        assert "it was asleep since" in note and "woke in" in note and "restored by value" in note, note
        assert "not restored: log (" in note and "open file" in note, note
        woke = state_of(api, sid)
        assert woke["state"] == "running" and woke["paused_by"] is None and woke["id"] == sid, woke
        assert support.cgroup_dirs(sid)
        api.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.slow
def test_with_the_setting_off_a_kept_sandbox_keeps_running(spawn_server):
    """The control: the same sandbox, bwrap_sleep_after_seconds=0."""
    server = spawn_server("--set", "bwrap_sleep_after_seconds=0")
    with server.client(timeout=300) as api:
        sid = support.create(api, metadata={"save_label": "notebook:awake"})["id"]
        support.ok(support.execute(api, sid, NOTEBOOK))
        assert state_of(api, sid).get("sleeps_at") is None
        # The sleeper looks every second: by 4 sleep-afters an on setting would have acted.
        assert not support.wait_for(lambda: state_of(api, sid)["state"] != "running", SLEEP_AFTER * 4)
        assert support.processes_of(support.sandbox_dir(server, sid), [sid]) and support.cgroup_dirs(sid)
        assert api.get("/v1/saves").json()["saves"] == []
        events = support.ok(support.execute(api, sid, "scale(2), 'log' in dir()"))
        assert support.result_text(events) == "(7, True)" and not support.stream_text(events, "stderr"), events
        api.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.slow
def test_a_sandbox_without_a_save_label_never_sleeps(spawn_server):
    server = spawn_server("--set", f"bwrap_sleep_after_seconds={SLEEP_AFTER}")
    with server.client(timeout=300) as api:
        sid = support.create(api)["id"]
        support.ok(support.execute(api, sid, "x = 1"))
        assert state_of(api, sid).get("sleeps_at") is None
        assert not support.wait_for(lambda: state_of(api, sid)["state"] != "running", SLEEP_AFTER * 4)
        api.delete(f"/v1/sandboxes/{sid}")
