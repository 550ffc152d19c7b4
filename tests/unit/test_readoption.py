"""A new server takes back what the previous one left: a paused sandbox rests on, one whose
supervisor died meanwhile is filed (and recorded) as lost, an ended one stays ended."""

from __future__ import annotations

import asyncio
import os

from sandbox.common import statefile
from sandbox.core.readoption import sandboxes_left
from sandbox.runtime import vocabulary as V

from sandbox_dirs import lay_out, new_manager


def test_readoption_keeps_the_paused_files_the_lost_and_skips_what_has_no_spec(tmp_path):
    manager = new_manager(tmp_path)
    lay_out(manager, "sbx-paused", V.PAUSED)
    lost = lay_out(manager, "sbx-lost", V.RUNNING, supervisor_pid=os.getpid())  # a pid, but not a supervisor
    lay_out(manager, "sbx-ended", V.EXPIRED)
    lay_out(manager, "sbx-half", None, spec=False)  # a create cut short before its spec
    assert sandboxes_left(manager.state_dir) == 3  # paused, running, and the one with no record
    asyncio.run(manager.readoption.adopt())
    assert list(manager.registry.live) == ["sbx-paused"]
    assert manager.registry.ended.keys() == {"sbx-lost", "sbx-ended"}
    record = statefile.read_json(os.path.join(lost, "state.json"))
    assert record["state"] == V.LOST and record["dead_reason"] == V.LOST
    assert "while the server was not running" in record["dead_message"]
    assert sandboxes_left(manager.state_dir) == 2  # the paused one, and the one with no record
