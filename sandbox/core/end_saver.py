"""Saving by value before a sandbox ends: its TTL about to run out, or the server's orderly stop.

A bubblewrap sandbox cannot be checkpointed, so a notebook's kept sandbox used to take every
variable with it when its TTL ended. A sandbox whose metadata names a ``save_label`` (the
kernel sets it for a notebook it keeps; an agent may set it too) is saved by value under that
label ``SAVE_LEAD_SECONDS`` before its TTL would end it, and again if a call slid the TTL since.
The save holds the supervisor's cell lock, which the TTL waits for, so a save that started
is never cut off by the TTL; it is bounded by ``save_seconds`` and the owner's caps. A save
that fails or is refused leaves the sandbox to end as it would have, with a warning in the
server's log.

The supervisor, not the server, ends a sandbox at its TTL (it keeps its deadlines while no
server runs): a TTL that runs out while the server is down is not preceded by a save.
"""

from __future__ import annotations

import asyncio
import logging

from ..common import statefile
from ..common.errors import ApiError
from ..runtime import vocabulary as V
from .handles import Handle
from .registry import Registry
from .saving import CALL_SLACK, StateSaving
from .supervisor_calls import SupervisorCalls
from .tenancy import Tenancy

log = logging.getLogger("sandbox.core.manager")

SAVE_LEAD_SECONDS = 5.0
LABEL_KEY = "save_label"


def save_label(handle: Handle) -> str | None:
    """The label a sandbox is saved under before it ends, or None (it is not)."""
    record = handle.record
    label = (record.get("metadata") or {}).get(LABEL_KEY)
    if not isinstance(label, str) or not label or record.get("state") != V.RUNNING:
        return None
    if (record.get("isolation") or {}).get("backend", V.BWRAP) != V.BWRAP:
        return None  # the gVisor tier sleeps by checkpoint instead
    return label[:512]


class EndSaver:
    def __init__(self, registry: Registry, saving: StateSaving, calls: SupervisorCalls, tenancy: Tenancy, seconds: int):
        self.registry, self.saving, self.calls = registry, saving, calls
        self.tenancy, self.seconds = tenancy, seconds
        self.saved_used_at: dict[str, str | None] = {}  # the use a sandbox's last save followed
        self.task: asyncio.Task | None = None

    def due(self, handle: Handle, now: float) -> bool:
        if save_label(handle) is None:
            return False
        record = handle.saved_record()
        expires = record.get("expires_at")
        if (expires is None or statefile.epoch(expires) - now > SAVE_LEAD_SECONDS or record.get("executing")
                or handle.record.get("executing")):
            return False
        return handle.id not in self.saved_used_at or self.saved_used_at[handle.id] != record.get("used_at")

    def tick(self, now: float) -> None:
        """Called by the reaper each second: start saving the sandboxes whose TTL nears its end."""
        if self.task is not None and not self.task.done():
            return
        live = self.registry.live
        self.saved_used_at = {i: u for i, u in self.saved_used_at.items() if i in live}
        due_now = [h for h in list(live.values()) if self.due(h, now)]
        if due_now:
            self.task = asyncio.create_task(self._save_all(due_now))

    async def _save_all(self, handles: list[Handle]) -> None:
        for handle in handles:
            await self.save_before_end(handle, "ttl")
            # The use the save followed, asked of the supervisor (state.json may lag a cell's end
            # by a second): a save queued behind a cell ran after that cell's use.
            try:
                await self.calls.call(handle, {"op": "status"})
            except ApiError:
                pass
            self.saved_used_at[handle.id] = handle.record.get("used_at")

    async def save_before_end(self, handle: Handle, by: str) -> dict | None:
        """Save ``handle`` under its label, within the save's bounds; None (logged) if it could not."""
        label = save_label(handle)
        if label is None:
            return None
        owner = self.tenancy.owner_of(handle.id)
        try:
            saved = await asyncio.wait_for(self.saving.save(handle, owner, label, by=by), self.seconds + 3 * CALL_SLACK)
        except Exception as exc:
            why = exc.message if isinstance(exc, ApiError) else str(exc) or type(exc).__name__
            log.warning("sandbox %s: not saved before it ends (%s): %s", handle.id, by, why)
            self.saving.store.note_failure(owner, label, {"source_sandbox": handle.id, "by": by, "message": why})
            return None
        log.info("sandbox %s: saved by value as %s (%s, %d bytes) before it ends", handle.id, saved["id"], by,
                 saved.get("bytes") or 0)
        return saved

    async def save_all_before_stop(self, handles: list[Handle]) -> None:
        """The server's orderly stop ends ``handles``: save those with a label first, together."""
        await asyncio.gather(*(self.save_before_end(h, "server_stop") for h in handles), return_exceptions=True)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
