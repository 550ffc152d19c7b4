"""Sleep-after on the gVisor tier: a sandbox with no call for ``gvisor_sleep_after_seconds``
is paused (its memory checkpointed to disk) and the next call wakes it with its variables,
saying how long it waited; a cell running longer than that is never paused under it; 0
turns it off; a bwrap sandbox never sleeps. Servers of their own, with a sleep-after of 3 s.
"""

from __future__ import annotations

import time

import pytest

import support

SLEEP_AFTER = 3


@pytest.fixture(scope="module")
def sleepy(image_source):
    """A server whose gVisor sandboxes sleep after 3 s without a call."""
    server = support.own_server(image_source, "--set", f"gvisor_sleep_after_seconds={SLEEP_AFTER}")
    server.open()
    yield server
    server.close()


@pytest.fixture
def client(sleepy):
    with sleepy.client(timeout=120) as c:
        yield c


def state_of(client, sid: str) -> dict:
    r = client.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


def processes(server, sid: str) -> dict:
    return support.processes_of(support.sandbox_dir(server, sid), [sid])


def test_an_idle_sandbox_sleeps_and_the_next_execute_wakes_it_with_its_variables(client, sleepy):
    sid = support.create(client, isolation="gvisor")["id"]
    support.ok(support.execute(client, sid, "x = 41\nblob = bytes(range(256)) * 40000"))
    awake = state_of(client, sid)
    assert awake["state"] == "running" and awake["sleeps_at"] and awake["paused_by"] is None, awake
    assert support.wait_for(lambda: state_of(client, sid)["state"] == "paused", 60), state_of(client, sid)
    asleep = state_of(client, sid)
    assert asleep["paused_by"] == "idle" and asleep["checkpoint"]["size_bytes"] > 0, asleep
    assert asleep["expires_at"] == awake["expires_at"], (awake, asleep)  # the pause did not renew the TTL
    # Its memory freed: the supervisor ends after the record says paused (it releases the cgroup
    # and the workspace and has runsc forget the container), which took over 15 s once on a
    # CI host running three gVisor suites side by side.
    assert support.wait_for(lambda: not processes(sleepy, sid), 60), processes(sleepy, sid)

    events = support.ok(support.execute(client, sid, "x + 1, len(blob)"))
    assert support.result_text(events) == "(42, 10240000)", events
    note = support.stream_text(events, "stderr")
    assert "it was asleep" in note and "woke in" in note and "restored from its checkpoint" in note, note
    woke = state_of(client, sid)
    assert woke["state"] == "running" and woke["paused_by"] is None, woke
    client.delete(f"/v1/sandboxes/{sid}")


def test_a_cell_longer_than_sleep_after_is_not_paused_under_it(client):
    sid = support.create(client, isolation="gvisor")["id"]
    support.ok(support.execute(client, sid, "y = 7"))
    events = support.ok(support.execute(client, sid, f"import time; time.sleep({SLEEP_AFTER * 3}); y * 6"))
    assert support.result_text(events) == "42" and not support.stream_text(events, "stderr"), events
    # Idle counts from the cell's end, not its start: it is up for a sleep-after more.
    ended = time.monotonic()
    while time.monotonic() - ended < SLEEP_AFTER - 1:
        assert state_of(client, sid)["state"] == "running", state_of(client, sid)
        time.sleep(0.2)
    assert support.wait_for(lambda: state_of(client, sid)["state"] == "paused", 60), state_of(client, sid)
    client.delete(f"/v1/sandboxes/{sid}")


def test_the_bwrap_tier_never_sleeps(client, sleepy):
    sid = support.create(client, isolation="bwrap")["id"]
    support.ok(support.execute(client, sid, "z = 1"))
    time.sleep(SLEEP_AFTER * 3)
    got = state_of(client, sid)
    assert got["state"] == "running" and "sleeps_at" not in got, got
    assert f"sandbox {sid} not put to sleep" not in sleepy.log_text()  # never even asked
    assert support.result_text(support.ok(support.execute(client, sid, "z"))) == "1"
    client.delete(f"/v1/sandboxes/{sid}")


def test_zero_turns_sleep_after_off(spawn_server):
    server = spawn_server(extra_env={"SANDBOX_KERNEL_GVISOR_SLEEP_AFTER": "0"})  # the environment's fallback
    with server.client(timeout=120) as c:
        sid = support.create(c, isolation="gvisor")["id"]
        support.ok(support.execute(c, sid, "w = 5"))
        time.sleep(SLEEP_AFTER * 3)
        got = state_of(c, sid)
        assert got["state"] == "running" and got["sleeps_at"] is None, got
        events = support.ok(support.execute(c, sid, "w"))
        assert support.result_text(events) == "5" and not support.stream_text(events, "stderr"), events
