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
