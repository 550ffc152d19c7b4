"""Sleep by value: the bwrap tier's answer to a gVisor sandbox's sleep by checkpoint.

A bwrap sandbox's processes live on the host kernel, which cannot checkpoint them; what a
notebook keeps overnight is mostly data, which can be saved by value. So a kept notebook's
sandbox (its metadata names a ``save_label``) with no call for ``bwrap_sleep_after_seconds``
is saved under that label (inside the sandbox, as ``%sandbox save`` is), and its supervisor
then ends its processes and records it ``paused`` with that save (``V.BY_VALUE``): its memory
and cgroup are freed, its id stays listed, its workspace stays on disk. The next call that
needs it running (``PauseResume.wake``) starts a new runtime under the same id and loads the
save into it; the first execute's note says when it fell asleep, how long the wake took, what
came back and what did not (open files, sockets, threads: by name and type).

The save is the sandbox's newest under its label, so a crash or a reboot while it sleeps
loses nothing more: the record says ``paused`` and the save is in the owner's store. Each
sleep replaces the one before it from the same sandbox (saves by ``sleep``), so a notebook
that sleeps and wakes every day does not fill its owner's room.
"""

from __future__ import annotations

import logging
import time

from ..common.errors import ApiError
from ..runtime import vocabulary as V
from .end_saver import EndSaver, save_label
from .handles import Handle
from .saving import StateSaving
from .supervisor_calls import SupervisorCalls
from .tenancy import Tenancy

log = logging.getLogger("sandbox.core.manager")

BY_SLEEP = "sleep"  # the ``by`` of a save made for a sleep
NAMES_SHOWN = 12


def sleeps_by_value(record: dict) -> bool:
    """A paused record that comes back from a save, not from a checkpoint."""
    return record.get("state") == V.PAUSED and isinstance(record.get(V.BY_VALUE), dict)


class ValueSleep:
    def __init__(self, saving: StateSaving, end_saver: EndSaver, calls: SupervisorCalls, tenancy: Tenancy):
        self.saving, self.end_saver, self.calls, self.tenancy = saving, end_saver, calls, tenancy

    @staticmethod
    def may_sleep(handle: Handle) -> bool:
        """A running bwrap sandbox that names the label its save would take."""
        return save_label(handle) is not None

    async def put_to_sleep(self, handle: Handle, idle_seconds: int) -> None:
        """Save ``handle`` by value, then have its supervisor end it as asleep. A save that fails
        (a cap, its time bound) leaves it running, logged; a call since the save makes the
        supervisor refuse (409 ``used_since``/``busy``), and the save stays as the newest."""
        saved = await self.end_saver.save_before_end(handle, BY_SLEEP)
        if saved is None:
            raise ApiError(409, "conflict", "its namespace could not be saved by value (see the log)",
                           extra={"reason": V.PAUSE_FAILED})
        summary = saved.get("summary") or {}
        by_value = {"save_id": saved["id"], "bytes": saved.get("bytes") or 0,
                    "saved_count": summary.get("saved_count", 0), "lost": summary.get("lost", [])[:NAMES_SHOWN],
                    "lost_count": summary.get("lost_count", 0)}
        await self.calls.call(handle, {"op": "pause", "by": V.PAUSED_BY_IDLE, "idle_seconds": idle_seconds,
                                       "message": f"no call for {idle_seconds} s", V.BY_VALUE: by_value})
        self._drop_earlier_sleeps(handle, saved["id"])

    def _drop_earlier_sleeps(self, handle: Handle, kept: str) -> None:
        owner = self.tenancy.owner_of(handle.id)
        label = (handle.record.get("metadata") or {}).get("save_label")
        for save in self.saving.store.list(owner, label):
            if save["id"] != kept and save.get("by") == BY_SLEEP and save.get("source_sandbox") == handle.id:
                try:
                    self.saving.store.delete(owner, save["id"])
                except ApiError:
                    pass  # deleted meanwhile

    async def load(self, handle: Handle, paused: dict, started: float) -> str:
        """Load the save a sandbox slept with into its new runtime; the wake's note."""
        by_value = paused.get(V.BY_VALUE) or {}
        try:
            restored = await self.saving.restore(handle, self.tenancy.owner_of(handle.id), by_value.get("save_id"))
        except ApiError as exc:  # the save was deleted while it slept: the sandbox runs, empty
            restored = {"error": exc.message, "save": {"id": by_value.get("save_id")}}
        return wake_note(paused, restored, time.monotonic() - started)


def _lost(items: list[dict], count: int | None) -> str:
    """As the kernel says a restore's losses: ``name (type: why)``."""
    shown = [f"{i.get('name')} ({i.get('type')}: {i.get('why')})" for i in items[:NAMES_SHOWN]]
    more = max(len(items), count or 0) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def wake_note(paused: dict, restored: dict, waited: float) -> str:
    """What the first call after a sleep by value says: since when it slept and why, how long
    the wake took, and what came back and what did not."""
    by_value = paused.get(V.BY_VALUE) or {}
    size = (by_value.get("bytes") or 0) / 2**20
    head = (f"[sandbox: it was asleep since {paused.get('paused_at')} ({paused.get('pause_message')}); woke in "
            f"{waited:.1f} s in a new process, its variables restored by value from {by_value.get('save_id')} "
            f"({size:.1f} MiB)")
    if restored.get("error"):
        return f"{head}, but they could not be loaded: {restored['error']}]\n"
    text = head + f": {restored.get('restored_count', len(restored.get('restored') or []))} came back"
    if restored.get("modules"):
        text += f"; imported again: {', '.join(str(m.get('name')) for m in restored['modules'][:NAMES_SHOWN])}"
    if restored.get("lost"):
        text += f"; not restored: {_lost(restored['lost'], restored.get('lost_count'))}"
    return text + "]\n"
