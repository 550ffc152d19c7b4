"""The registry files a sandbox as ended when its supervisor is gone, and answers for it after."""

from __future__ import annotations

import os

import pytest

from sandbox.common.errors import ApiError
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager, sleeper


def test_a_sandbox_whose_supervisor_is_gone_is_filed_dead_and_answers_410(tmp_path):
    manager = new_manager(tmp_path)
    handle = handle_of(manager, "sbx-a", V.RUNNING)  # no supervisor process at all
    registry = manager.registry
    with pytest.raises(ApiError) as gone:
        registry.get("sbx-a")
    assert gone.value.status == 410
    assert "sbx-a died" in gone.value.message and "ended unexpectedly" in gone.value.message
    assert (gone.value.extra["state"], gone.value.extra["reason"]) == (V.DEAD, V.CRASHED)
    assert "sbx-a" not in registry.live and registry.ended["sbx-a"]["state"] == V.DEAD
    assert not os.path.exists(os.path.join(handle.dir, "workspace")), "an ended sandbox's workspace stays"


def test_a_live_supervisor_keeps_its_sandbox_live(tmp_path):
    manager = new_manager(tmp_path)
    process = sleeper()
    try:
        handle_of(manager, "sbx-b", V.RUNNING, process=process)
        assert manager.registry.get("sbx-b").id == "sbx-b"
        assert [h.id for h in manager.registry.claimed()] == ["sbx-b"]
    finally:
        process.kill()
        process.wait()


def test_a_supervisor_that_recorded_its_end_is_filed_at_once_and_reaped_later(tmp_path):
    manager = new_manager(tmp_path)
    process = sleeper()
    try:
        handle_of(manager, "sbx-c", V.EXPIRED, process=process, end_message="its TTL ran out")
        with pytest.raises(ApiError) as gone:
            manager.registry.get("sbx-c")
        assert gone.value.status == 410 and gone.value.message == "sandbox sbx-c expired: its TTL ran out"
        assert manager.registry.reaping == [process]
    finally:
        process.kill()
        process.wait()


def test_a_paused_sandbox_stays_live_without_a_supervisor(tmp_path):
    manager = new_manager(tmp_path)
    handle_of(manager, "sbx-p", V.PAUSED)
    assert manager.registry.get("sbx-p").record["state"] == V.PAUSED
    assert "sbx-p" not in manager.registry.ended


def test_pooled_and_unknown_ids_are_404(tmp_path):
    manager = new_manager(tmp_path)
    process = sleeper()
    try:
        handle_of(manager, "sbx-pool", V.POOLED, process=process)
        for sandbox_id in ("sbx-pool", "sbx-nobody"):
            with pytest.raises(ApiError) as missing:
                manager.registry.get(sandbox_id)
            assert missing.value.status == 404
        assert manager.registry.claimed() == []
    finally:
        process.kill()
        process.wait()


def test_forgetting_a_tombstone_makes_the_id_unknown(tmp_path):
    manager = new_manager(tmp_path)
    handle_of(manager, "sbx-d", V.RUNNING)
    manager.registry.claimed()  # files it
    manager.registry.forget("sbx-d")
    with pytest.raises(ApiError) as missing:
        manager.registry.get("sbx-d")
    assert missing.value.status == 404
