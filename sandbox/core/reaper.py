"""The reaper: the server's clock for what no request asks about.

Once a second it files sandboxes whose supervisor ended (so a listing never shows a dead
one for long), ends paused sandboxes that reached their maximum lifetime (no supervisor
runs to count it) and sleeping ones whose TTL ran out (sleeper.py), lets the sleeper put
idle gVisor sandboxes to sleep, waits for exited supervisors, and removes tombstones a day old.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Awaitable, Callable

from ..common import statefile
from .handles import Handle
from ..common.paths import StateDir
from .registry import Registry
from . import sleeper
from ..runtime import vocabulary as V

log = logging.getLogger("sandbox.core.manager")

TOMBSTONE_SECONDS = 24 * 3600
TICK_SECONDS = 1.0

EndPaused = Callable[[Handle, str, str], Awaitable[None]]


class Reaper:
    def __init__(self, state_dir: StateDir, registry: Registry, end_paused: EndPaused,
                 resting: Callable[[Handle], bool], sleep_idle: Callable[[float], None]):
        self.state_dir = state_dir
        self.registry = registry
        self.end_paused = end_paused  # ends a paused sandbox by its files (see PauseResume)
        self.resting = resting  # paused with no supervisor
        self.sleep_idle = sleep_idle  # starts the sleeper's pauses of idle sandboxes (Sleeper.tick)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                await self.tick(time.time())
            except Exception:
                log.exception("reaper pass failed")

    async def tick(self, now: float) -> None:
        """One pass, as of ``now`` (seconds since the epoch)."""
        for handle in list(self.registry.live.values()):
            self.registry.check(handle)
            if self.resting(handle):
                cap = handle.record.get("max_expires_at")
                if cap is not None and statefile.epoch(cap) <= now:
                    await self.end_paused(handle, V.EXPIRED, "it reached its maximum lifetime while paused")
                elif sleeper.ttl_ran_out(handle.record, now):
                    await self.end_paused(handle, V.EXPIRED, f"it was not used within its TTL of "
                                          f"{handle.record.get('ttl_seconds')} s (asleep since "
                                          f"{handle.record.get('paused_at')})")
        self.sleep_idle(now)
        self.registry.reaping = [p for p in self.registry.reaping if p.poll() is None]
        self.remove_tombstones(now - TOMBSTONE_SECONDS)

    def remove_tombstones(self, cutoff: float) -> None:
        """Remove the directories of ended sandboxes last touched before ``cutoff``."""
        for sandbox_id in list(self.registry.ended):
            d = self.state_dir.sandbox(sandbox_id)
            try:
                if os.stat(d).st_mtime < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
                    self.registry.forget(sandbox_id)
            except FileNotFoundError:
                self.registry.forget(sandbox_id)
