"""The registry waits for an ending supervisor without blocking the server's event loop.

Creating a sandbox whose start failed, and deleting one, wait up to 15 s for its supervisor
to exit. That wait used to be a `time.sleep` loop run on the event loop (from the async
`Launcher.spawn`): every other request of every other user stalled behind one slow sandbox.

A real process that takes a while to exit stands in for a supervisor tearing down (making
a real one linger at exactly that moment is not reproducible); the event loop, the manager
and its registry are the real ones.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

from sandbox.core.config import ServiceConfig
from sandbox.core.handles import Handle
from sandbox.core.manager import SandboxManager


def test_waiting_for_a_supervisor_to_exit_leaves_the_event_loop_free(tmp_path):
    manager = SandboxManager(ServiceConfig(state_dir=str(tmp_path / "state")))
    sandbox_dir = tmp_path / "sbx-slow"
    sandbox_dir.mkdir()
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    handle = Handle("sbx-slow", str(sandbox_dir), "default", None, pid=slow.pid, process=slow,
                    record={"state": "dead", "dead_reason": "failed_to_start"})
    manager.live[handle.id] = handle
    served_meanwhile = 0  # turns the loop gave another task while the "supervisor" was still there

    async def other_requests():
        nonlocal served_meanwhile
        while True:
            if slow.poll() is None:
                served_meanwhile += 1
            await asyncio.sleep(0.01)

    async def main():
        other = asyncio.create_task(other_requests())
        await asyncio.sleep(0)  # the other task is running before the wait starts
        served_meanwhile_at_start = served_meanwhile
        await manager.registry.wait_for_exit(handle)
        other.cancel()
        return served_meanwhile_at_start

    at_start = asyncio.run(main())
    try:
        assert slow.poll() is not None, "the wait returned before the supervisor exited"
        assert served_meanwhile > at_start + 1, "the event loop served nothing else while it waited"
        assert handle.id not in manager.live and handle.id in manager.ended
    finally:
        slow.kill()
        slow.wait()
