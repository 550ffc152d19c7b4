"""Sleep-after, decided without runsc: which running sandbox is due to be put to sleep, that a
refusal (busy, used since) is not asked again before it could be due, and that a sandbox put
to sleep keeps its TTL (ended when it runs out, on_idle delete) and its maximum lifetime."""

from __future__ import annotations

import asyncio
import os
import time

from sandbox.common import statefile
from sandbox.common.errors import ApiError
from sandbox.core import sleeper
from sandbox.core.config import ServiceConfig
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager

NOW = 1_800_000_000.0
GVISOR = {"backend": V.GVISOR}


def running(used_ago: float, ttl_left: float = 3600.0, backend: str = V.GVISOR, **more) -> dict:
    return {"state": V.RUNNING, "isolation": {"backend": backend}, "used_at": statefile.iso(NOW - used_ago),
            "expires_at": statefile.iso(NOW + ttl_left), **more}


def test_a_running_gvisor_sandbox_is_due_once_its_last_call_is_sleep_after_old():
    assert sleeper.due(running(used_ago=600), 0.0, 600, NOW)
    assert not sleeper.due(running(used_ago=599), 0.0, 600, NOW)
    assert sleeper.sleeps_at(running(used_ago=100), 0.0, 600) == NOW + 500


def test_a_call_the_server_saw_counts_as_use_though_the_supervisor_has_not_heard_it():
    assert not sleeper.due(running(used_ago=900), NOW - 10, 600, NOW)
    assert sleeper.due(running(used_ago=900), NOW - 600, 600, NOW)


def test_zero_never_sleeps():
    assert not sleeper.due(running(used_ago=10 ** 6), 0.0, 0, NOW)
    assert sleeper.sleeps_at(running(used_ago=10), 0.0, 0) is None


def test_a_bwrap_sandbox_sleeps_by_value_only_when_it_names_a_save_label():
    config = ServiceConfig(gvisor_sleep_after_seconds=600, bwrap_sleep_after_seconds=900)
    labelled = running(used_ago=10, backend=V.BWRAP, metadata={"save_label": "notebook:x"})
    assert sleeper.sleep_after_of(labelled, config) == 900
    assert sleeper.sleep_after_of(running(used_ago=10, backend=V.BWRAP), config) == 0
    assert sleeper.sleep_after_of(running(used_ago=10, backend=V.BWRAP, metadata={"save_label": ""}), config) == 0
    assert sleeper.sleep_after_of(running(used_ago=10, metadata={"save_label": "notebook:x"}), config) == 600
    off = ServiceConfig(bwrap_sleep_after_seconds=0)
    assert sleeper.sleep_after_of(labelled, off) == 0


def test_only_a_running_sandbox_sleeps():
    for state in (V.PAUSED, V.POOLED, V.BOOTING, V.DEAD):
        assert not sleeper.due({**running(used_ago=10 ** 4), "state": state}, 0.0, 600, NOW), state


def test_a_ttl_shorter_than_sleep_after_comes_first():
    """min(sleep-after, TTL): the TTL's own end (or on_idle pause) acts, the sleeper does not."""
    assert sleeper.sleeps_at(running(used_ago=0, ttl_left=300), 0.0, 600) is None
    assert not sleeper.due(running(used_ago=700, ttl_left=0), 0.0, 600, NOW)
    assert sleeper.due(running(used_ago=700, ttl_left=1), 0.0, 600, NOW)


def slept(ttl_left: float, on_idle: str = V.ON_IDLE_DELETE, by: str = V.PAUSED_BY_IDLE) -> dict:
    now = time.time()
    return {"isolation": GVISOR, "paused_by": by, "on_idle": on_idle, "ttl_seconds": 60,
            "paused_at": statefile.iso(now - 30), "expires_at": now + ttl_left, "max_expires_at": now + 3600}


def test_a_sleeping_sandbox_ends_when_its_ttl_runs_out_unless_it_pauses_on_idle(tmp_path):
    manager = new_manager(tmp_path)
    over = handle_of(manager, "sbx-over", V.PAUSED, **slept(ttl_left=-1))
    handle_of(manager, "sbx-left", V.PAUSED, **slept(ttl_left=60))
    handle_of(manager, "sbx-pause", V.PAUSED, **slept(ttl_left=-1, on_idle=V.ON_IDLE_PAUSE))
    handle_of(manager, "sbx-asked", V.PAUSED, **slept(ttl_left=-1, by=V.PAUSED_BY_REQUEST))  # as before
    asyncio.run(manager.reaper.tick(time.time()))
    assert sorted(manager.registry.live) == ["sbx-asked", "sbx-left", "sbx-pause"]
    record = statefile.read_json(os.path.join(over.dir, "state.json"))
    assert record["state"] == V.EXPIRED and "TTL of 60 s (asleep since" in record["end_message"], record


class Pausing:
    """PauseResume's put_to_sleep, as the sleeper calls it: records whom it was asked to put
    to sleep, and refuses as a busy supervisor does."""

    def __init__(self, refuse: set[str]):
        self.asked: list[str] = []
        self.refuse = refuse

    async def put_to_sleep(self, handle, idle_seconds):
        self.asked.append(handle.id)
        if handle.id in self.refuse:
            raise ApiError(409, "conflict", "a cell is running", extra={"reason": V.PAUSE_BUSY})
        return True


def test_the_sleeper_asks_only_the_due_and_not_again_before_a_refused_one_could_be_due(tmp_path):
    manager = new_manager(tmp_path, gvisor_sleep_after_seconds=60, bwrap_sleep_after_seconds=60)
    now = time.time()
    for sid, ago, backend in (("sbx-idle", 61, V.GVISOR), ("sbx-busy", 61, V.GVISOR), ("sbx-used", 5, V.GVISOR),
                              ("sbx-bwrap", 61, V.BWRAP)):
        handle_of(manager, sid, V.RUNNING, isolation={"backend": backend}, used_at=statefile.iso(now - ago),
                  expires_at=now + 3600)
    handle_of(manager, "sbx-kept", V.RUNNING, isolation={"backend": V.BWRAP}, used_at=statefile.iso(now - 61),
              expires_at=now + 3600, metadata={"save_label": "notebook:kept"})
    pausing = manager.sleeper.pausing = Pausing(refuse={"sbx-busy"})

    async def two_passes():
        for _ in range(2):
            manager.sleeper.tick(time.time())
            await manager.sleeper.task

    asyncio.run(two_passes())
    # sbx-busy waits a sleep-after; a bwrap sandbox sleeps (by value) only with a save label
    assert pausing.asked == ["sbx-idle", "sbx-busy", "sbx-kept", "sbx-idle", "sbx-kept"], pausing.asked
    assert manager.sleeper.not_before["sbx-busy"] >= now + 60


def test_the_sandbox_object_says_when_it_sleeps_and_who_paused_it(tmp_path):
    manager = new_manager(tmp_path, gvisor_sleep_after_seconds=60)
    now = time.time()
    up = handle_of(manager, "sbx-up", V.RUNNING, isolation=GVISOR, used_at=statefile.iso(now - 10),
                   expires_at=now + 3600)
    view = manager.describe(up)
    assert abs(statefile.epoch(view["sleeps_at"]) - (now + 50)) < 0.01 and view["paused_by"] is None, view
    asleep = handle_of(manager, "sbx-asleep", V.PAUSED, **slept(ttl_left=60))
    view = manager.describe(asleep)
    assert view["paused_by"] == V.PAUSED_BY_IDLE and view["sleeps_at"] is None, view
