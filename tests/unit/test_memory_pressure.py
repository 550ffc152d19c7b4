"""Before a create, the host's real memory must hold the new sandbox's request: idle gVisor
sandboxes are put to sleep for it, the longest idle first, and only then is the create
refused, with the reason.

The host's free memory is the one boundary replaced here (``available``: the suite cannot
make this shared host short of memory), and so is the checkpoint itself (``put_to_sleep``:
a gVisor pause of a real sandbox is tests/gvisor's subject); what they stand in for frees
memory as a real sleep would, so the test sees the choice and the order of the sleeps.
"""

from __future__ import annotations

import asyncio

import pytest

from sandbox.common.errors import ApiError
from sandbox.core.memory_pressure import HOST_MEMORY_SHORT, available_mb
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager

GVISOR = {"backend": V.GVISOR}


def pressured(tmp_path, free_mb: int, freed_per_sleep: int):
    manager = new_manager(tmp_path, memory_request_mb=256, memory_reserve_mb=100)
    host = {"free": free_mb}
    slept: list[str] = []

    async def put_to_sleep(handle, idle_seconds):  # stands in for the gVisor checkpoint
        slept.append(handle.id)
        handle.record["state"] = V.PAUSED
        host["free"] += freed_per_sleep
        return True

    manager.pressure.available = lambda: host["free"]
    manager.pausing.put_to_sleep = put_to_sleep
    return manager, slept


def test_a_create_that_fits_in_real_memory_puts_nobody_to_sleep(tmp_path):
    manager, slept = pressured(tmp_path, free_mb=356, freed_per_sleep=500)
    handle_of(manager, "sbx-idle", V.RUNNING, isolation=GVISOR, used_at="2026-01-01T00:00:00Z")
    asyncio.run(manager.pressure.make_room({"memory_mb": 1024}))
    assert slept == []


def test_idle_gvisor_sandboxes_sleep_longest_idle_first_until_the_request_fits(tmp_path):
    manager, slept = pressured(tmp_path, free_mb=100, freed_per_sleep=200)
    handle_of(manager, "sbx-recent", V.RUNNING, isolation=GVISOR, used_at="2026-01-01T10:00:00Z")
    handle_of(manager, "sbx-oldest", V.RUNNING, isolation=GVISOR, used_at="2026-01-01T08:00:00Z")
    handle_of(manager, "sbx-older", V.RUNNING, isolation=GVISOR, used_at="2026-01-01T09:00:00Z")
    handle_of(manager, "sbx-bwrap", V.RUNNING, isolation={"backend": V.BWRAP}, used_at="2026-01-01T00:00:00Z")
    asyncio.run(manager.pressure.make_room({"memory_mb": 1024}))  # wants 256 + 100 kept free
    assert slept == ["sbx-oldest", "sbx-older"], slept


def test_with_nothing_left_to_put_to_sleep_the_create_is_refused_with_the_reason(tmp_path):
    manager, slept = pressured(tmp_path, free_mb=100, freed_per_sleep=50)
    handle_of(manager, "sbx-idle", V.RUNNING, isolation=GVISOR, used_at="2026-01-01T08:00:00Z")
    handle_of(manager, "sbx-bwrap", V.RUNNING, isolation={"backend": V.BWRAP})
    with pytest.raises(ApiError) as refused:
        asyncio.run(manager.pressure.make_room({"memory_mb": 1024}))
    error = refused.value
    assert error.status == 409 and error.extra["reason"] == HOST_MEMORY_SHORT, error.body()
    assert error.extra["available_mb"] == 150 and error.extra["request_mb"] == 256 and error.extra["slept"] == 1
    assert "150 MB available" in error.message and "1 idle gVisor sandbox(es) were put to sleep" in error.message
    assert slept == ["sbx-idle"], "the bubblewrap sandbox has no checkpoint: it is never put to sleep"


def test_creates_under_way_count_as_taken(tmp_path):
    manager, slept = pressured(tmp_path, free_mb=400, freed_per_sleep=0)
    assert manager.pressure.short_by({"memory_mb": 1024}) == 0
    with manager.ledger.reserving({"memory_mb": 1024}):
        assert manager.pressure.short_by({"memory_mb": 1024}) == 256 + 100 + 256 - 400


def test_a_fork_the_hosts_memory_cannot_hold_is_refused_before_anything_is_laid_out(tmp_path):
    manager, slept = pressured(tmp_path, free_mb=100, freed_per_sleep=0)
    source = handle_of(manager, "sbx-source", V.PAUSED, isolation=GVISOR, limits={"memory_mb": 1024})
    with pytest.raises(ApiError) as refused:
        asyncio.run(manager.fork(source, {}))
    assert refused.value.extra["reason"] == HOST_MEMORY_SHORT, refused.value.body()
    assert list(manager.live) == ["sbx-source"] and manager.ledger.reserved == []


def test_the_hosts_available_memory_is_read():
    assert 0 < available_mb()
