"""The reaper's pass: a paused sandbox past its maximum lifetime ends (no supervisor counts
it), one before it rests on, and tombstones older than a day are removed."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from sandbox.common import statefile
from sandbox.common.errors import ApiError
from sandbox.core.reaper import TOMBSTONE_SECONDS
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager


def test_a_paused_sandbox_ends_at_its_maximum_lifetime(tmp_path):
    manager = new_manager(tmp_path)
    now = time.time()
    old = handle_of(manager, "sbx-old", V.PAUSED, max_expires_at=now - 1)
    handle_of(manager, "sbx-young", V.PAUSED, max_expires_at=now + 60)
    asyncio.run(manager.reaper.tick(now))
    assert list(manager.registry.live) == ["sbx-young"]
    record = statefile.read_json(os.path.join(old.dir, "state.json"))
    assert record["state"] == V.EXPIRED and record["end_message"] == "it reached its maximum lifetime while paused"
    with pytest.raises(ApiError) as gone:
        manager.get("sbx-old")
    assert gone.value.status == 410


def test_tombstones_older_than_a_day_are_removed(tmp_path):
    manager = new_manager(tmp_path)
    for sandbox_id in ("sbx-day-old", "sbx-recent"):
        handle_of(manager, sandbox_id, V.RUNNING)  # no supervisor: filed as dead by the pass
    asyncio.run(manager.reaper.tick(time.time()))
    assert set(manager.registry.ended) == {"sbx-day-old", "sbx-recent"}
    day_old = manager.state_dir.sandbox("sbx-day-old")
    past = time.time() - TOMBSTONE_SECONDS - 60
    os.utime(day_old, (past, past))
    asyncio.run(manager.reaper.tick(time.time()))
    assert set(manager.registry.ended) == {"sbx-recent"} and not os.path.exists(day_old)
    assert os.path.isdir(manager.state_dir.sandbox("sbx-recent"))
