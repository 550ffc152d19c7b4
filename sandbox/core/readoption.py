"""Re-adoption after a restart: the sandboxes a previous server left, taken back.

A sandbox's truth is on disk (its ``spec.json`` and ``state.json``) and in its supervisor,
never only in the server's memory: a new server re-attaches to every supervisor still
alive, keeps paused sandboxes as they rest, puts warm ones back in the pool, and files
the others as ``lost``.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from ..common import statefile
from ..egress.service import EgressService
from ..common.errors import ApiError
from .handles import Handle, pid_is_supervisor
from ..common.paths import StateDir
from .registry import Registry
from ..runtime import vocabulary as V
from .supervisor_calls import SupervisorCalls
from .tenancy import Link
from .warm_pool import WarmPool

log = logging.getLogger("sandbox.core.manager")


def sandboxes_left(state_dir: StateDir) -> int:
    """How many sandboxes a previous server left that have not ended (kept running, or
    paused): the next `adopt` takes them back, so the images they run on must stay."""
    left = 0
    for sandbox_id in os.listdir(state_dir.sandboxes):
        record = statefile.read_json(os.path.join(state_dir.sandbox(sandbox_id), "state.json"))
        left += record is None or record.get("state") not in V.ENDED_STATES
    return left


class Readoption:
    def __init__(self, state_dir: StateDir, registry: Registry, calls: SupervisorCalls, pool: WarmPool,
                 egress: EgressService, caller_exited: Callable[[str, Link], None]):
        self.state_dir = state_dir
        self.registry = registry
        self.calls = calls
        self.pool = pool
        self.egress = egress
        self.caller_exited = caller_exited  # ends a sandbox whose creating process exited

    async def adopt(self) -> None:
        """Re-attach to every sandbox a previous server left running; report the lost ones."""
        try:
            names = os.listdir(self.state_dir.sandboxes)
        except FileNotFoundError:
            return
        for sandbox_id in names:
            await self.adopt_one(sandbox_id)

    async def adopt_one(self, sandbox_id: str) -> None:
        d = self.state_dir.sandbox(sandbox_id)
        spec = statefile.read_json(os.path.join(d, "spec.json"))
        record = statefile.read_json(os.path.join(d, "state.json"))
        if spec is None:
            return
        tenancy = self.registry.tenancy
        link = tenancy.load(sandbox_id, d)
        if record is None:
            record = {"id": sandbox_id, "state": V.LOST, "dead_reason": V.LOST}
        if record.get("state") in V.ENDED_STATES:
            self.registry.bury(sandbox_id, record, d)
            return
        handle = Handle(sandbox_id, d, spec["image"], spec.get("uid"), pid=record.get("supervisor_pid"), record=record)
        alive = pid_is_supervisor(handle.pid, d)
        if record.get("state") == V.PAUSED and not alive:  # nothing runs; the next call restores it
            self.registry.live[sandbox_id] = handle
            log.info("sandbox %s is paused (checkpoint kept)", sandbox_id)
            return
        reply = None
        if alive:
            try:
                reply = await self.calls.call(handle, {"op": "status"}, timeout=5)
            except ApiError:
                reply = None
        if reply and reply.get("state"):
            handle.record = reply["state"]
            self.registry.live[sandbox_id] = handle
            await self.egress.reopen(sandbox_id, d, spec, spec.get("uid"))
            if handle.record.get("state") == V.POOLED:
                self.pool.add(handle.image, sandbox_id, spec.get("isolation_backend") or V.BWRAP)
            log.info("re-attached to sandbox %s (%s)", sandbox_id, handle.record.get("state"))
            if link is not None:  # ended at once if its process exited while we were down
                tenancy.watch(sandbox_id, link, self.caller_exited)
        else:
            V.advance(record, V.LOST, dead_reason=V.LOST,
                      dead_message="its processes ended while the server was not running")
            statefile.write_json(os.path.join(d, "state.json"), record)
            self.registry.bury(sandbox_id, record, d)
            log.warning("sandbox %s was lost while the server was down", sandbox_id)
