"""Ending a paused sandbox removes its checkpoint and files it; a fork of a bwrap sandbox is
refused before anything is paused or laid out."""

from __future__ import annotations

import asyncio
import os

import pytest

from sandbox.isolation import checkpoints
from sandbox.common import statefile
from sandbox.common.errors import ApiError
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager


def test_ending_a_paused_sandbox_discards_its_checkpoint(tmp_path):
    manager = new_manager(tmp_path)
    handle = handle_of(manager, "sbx-rest", V.PAUSED)
    os.makedirs(checkpoints.image_path(handle.dir))
    statefile.write_json(checkpoints.record_path(handle.dir), {"size_bytes": 1})
    assert manager.pausing.resting(handle)
    asyncio.run(manager.end(handle, "it was deleted"))
    assert not os.path.exists(checkpoints.image_path(handle.dir))
    assert not os.path.exists(checkpoints.record_path(handle.dir))
    record = statefile.read_json(os.path.join(handle.dir, "state.json"))
    assert record["state"] == V.DELETED and record["ended_at"]
    assert manager.registry.ended["sbx-rest"]["state"] == V.DELETED and "sbx-rest" not in manager.live


def test_a_fork_of_a_bwrap_sandbox_is_refused_with_its_reason(tmp_path):
    manager = new_manager(tmp_path)
    handle = handle_of(manager, "sbx-bwrap", V.PAUSED)  # its spec names no gVisor backend
    with pytest.raises(ApiError) as refused:
        asyncio.run(manager.fork(handle, {}))
    assert refused.value.status == 409 and refused.value.extra == {"reason": V.PAUSE_NOT_SUPPORTED}
    assert list(manager.live) == ["sbx-bwrap"] and manager.ledger.reserved == []


def test_a_restore_that_no_longer_fits_is_refused_and_the_sandbox_stays_paused(tmp_path):
    """A paused sandbox gave its memory back; if others took it meanwhile, its restore gets
    the create's 409 before any supervisor starts, and it stays paused with its checkpoint.
    On a shared server the same holds for its owner's share while the server has room."""
    MiB = 1024 * 1024
    limits = {"memory_mb": 1024, "cpus": 1.0, "pids": 256, "disk_mb": 100}
    manager = new_manager(tmp_path, total_memory_mb=2048, multi_user=True, user_share=0.5,
                          memory_request_mb=0)  # each reserves its whole limit
    paused = handle_of(manager, "sbx-sleeper", V.PAUSED, limits=limits, checkpoint={"size_bytes": 300 * MiB})
    other = handle_of(manager, "sbx-other", V.RUNNING, limits={**limits, "memory_mb": 1536})
    started = []
    manager.launcher.start_supervisor = lambda *a: started.append(a)  # never reached
    with pytest.raises(ApiError) as refused:
        asyncio.run(manager.wake(paused))
    err = refused.value
    assert err.status == 409 and err.code == "capacity_exceeded", err.body()
    assert "no room for the paused sandbox sbx-sleeper" in err.message and "memory_mb 1024 does not fit: 512 free" \
        in err.message, err.message
    assert started == [] and paused.record["state"] == V.PAUSED and manager.ledger.reserved == []
    # Control: with room again, the check lets the restore through (memory and disk are not counted twice).
    other.record["limits"]["memory_mb"] = 1024
    manager.ledger.check_restore(paused)
    # Its owner's share: alice (uid 1001) holds her 1024 MB share in another sandbox; the server has room.
    manager.registry.tenancy.owners.update({"sbx-sleeper": 1001, "sbx-other": 1001})
    other.record["limits"]["memory_mb"] = 1024
    manager.config.total_memory_mb = 4096
    manager.ledger.check_restore(paused)  # 1024 + 1024 of her 2048 share
    other.record["limits"]["memory_mb"] = 1536
    with pytest.raises(ApiError) as over_share:
        manager.ledger.check_restore(paused)
    assert "uid 1001's share of this server is used" in over_share.value.message, over_share.value.message
