"""Sleep-after: a gVisor sandbox with no call for ``gvisor_sleep_after_seconds`` (default 10
minutes) is paused, its memory checkpointed to disk, and woken by its next call like any
paused sandbox (``PauseResume.wake``). An idle notebook then costs disk, not memory.

Only a *running* gVisor sandbox is put to sleep, once its last call (the later of the
supervisor's ``used_at`` and the server's ``called_at``) is that old and its TTL has not run
out: with a shorter TTL, the TTL's own end (or its ``on_idle: "pause"``) comes first. A
sandbox running a cell or a command is never paused under it: the supervisor refuses
(``busy``), as it refuses one used since the server looked (``used_since``), and the server
holds the sandbox's restore lock through the pause, so a call arriving meanwhile waits and
wakes it. Asleep, its TTL and maximum lifetime run on as if it were up: ``ttl_ran_out``
says when the reaper ends one (``on_idle: "delete"``; with ``"pause"`` it stays paused, as
its TTL would have left it). The pause is an ordinary one (``paused_by: "idle"``): it gives
its memory back to the capacity ledger, and the wake asks for it again.

A bwrap sandbox cannot be checkpointed: a kept notebook's one (its metadata names a
``save_label``) sleeps by value instead, after ``bwrap_sleep_after_seconds``, under the same
rules (value_sleep.py); any other bwrap sandbox runs until its TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..common import statefile
from ..common.errors import ApiError
from .config import ServiceConfig
from .end_saver import LABEL_KEY
from .handles import Handle
from .pause_resume import PauseResume
from .registry import Registry
from ..runtime import vocabulary as V

log = logging.getLogger("sandbox.core.manager")


def _epoch(value) -> float | None:
    return statefile.epoch(value) if value not in (None, "") else None


def last_call(record: dict, called_at: float = 0.0) -> float | None:
    """When the sandbox was last used: the later of its supervisor's ``used_at`` (cells,
    commands, renews) and the server's ``called_at`` (any call that needed it running)."""
    used = _epoch(record.get("used_at"))
    latest = max(used or 0.0, called_at or 0.0)
    return latest or None


def sleep_after_of(record: dict, config: ServiceConfig) -> int:
    """The idle time after which this sandbox is put to sleep (0: never): a gVisor one by
    checkpoint (``gvisor_sleep_after_seconds``); a bwrap one by value, only if its metadata
    names the label its save takes (``bwrap_sleep_after_seconds``; value_sleep.py)."""
    backend = (record.get("isolation") or {}).get("backend", V.BWRAP)
    if backend == V.GVISOR:
        return config.gvisor_sleep_after_seconds
    label = (record.get("metadata") or {}).get(LABEL_KEY)
    if backend == V.BWRAP and isinstance(label, str) and label:
        return config.bwrap_sleep_after_seconds
    return 0


def sleeps_at(record: dict, called_at: float, sleep_after: int) -> float | None:
    """When a running sandbox will be put to sleep if no call comes, or None: it never will
    (``sleep_after`` 0: off or not for its tier; not running; its TTL ends it first)."""
    if sleep_after <= 0 or record.get("state") != V.RUNNING:
        return None
    last = last_call(record, called_at)
    expires = _epoch(record.get("expires_at"))
    if last is None or (expires is not None and last + sleep_after >= expires):
        return None
    return last + sleep_after


def due(record: dict, called_at: float, sleep_after: int, now: float) -> bool:
    """Whether the sleeper should pause this sandbox now (the supervisor still refuses a
    busy one)."""
    when, expires = sleeps_at(record, called_at, sleep_after), _epoch(record.get("expires_at"))
    return when is not None and when <= now and (expires is None or now < expires)


def ttl_ran_out(record: dict, now: float) -> bool:
    """A sandbox put to sleep whose TTL passed while it slept, and which its TTL ends
    (``on_idle: "delete"``): the reaper ends it, as its supervisor would have."""
    expires = _epoch(record.get("expires_at"))
    return (record.get("state") == V.PAUSED and record.get("paused_by") == V.PAUSED_BY_IDLE
            and (record.get("on_idle") or V.ON_IDLE_DELETE) == V.ON_IDLE_DELETE
            and expires is not None and expires <= now)


def _freshest(handle: Handle) -> dict:
    """The record heard last, with the later ``used_at`` of it and state.json: a cell's end
    reaches state.json within a second (the supervisor's save_soon), not the heard record."""
    record = handle.record
    if record.get("state") != V.RUNNING:
        return record
    saved = handle.saved_record().get("used_at")
    if saved and (not record.get("used_at") or _epoch(saved) > _epoch(record["used_at"])):
        return {**record, "used_at": saved}
    return record


class Sleeper:
    """Puts due sandboxes to sleep, one at a time (a checkpoint takes a core for seconds),
    in a task of its own so that the reaper's pass never waits for one."""

    def __init__(self, config: ServiceConfig, registry: Registry, pausing: PauseResume):
        self.config = config
        self.registry = registry
        self.pausing = pausing
        self.task: asyncio.Task | None = None
        # A refused sandbox is not asked again before this: busy or used at the refusal, it
        # cannot be due before a whole sleep-after from then.
        self.not_before: dict[str, float] = {}

    def sleeps_at(self, handle: Handle) -> float | None:
        record = _freshest(handle)
        return sleeps_at(record, handle.called_at, sleep_after_of(record, self.config))

    def stop(self) -> None:
        """At shutdown: no pause is started any more (one under way ends in its supervisor)."""
        if self.task is not None:
            self.task.cancel()

    def tick(self, now: float) -> None:
        if self.task is not None and not self.task.done():
            return
        live = self.registry.live
        self.not_before = {i: t for i, t in self.not_before.items() if i in live and t > now}
        due_now = [h for h in list(live.values()) if h.id not in self.not_before and self._due(h, now)]
        if due_now:
            self.task = asyncio.create_task(self._sleep(due_now))

    def _due(self, handle: Handle, now: float) -> bool:
        # The record heard last is enough to rule most out; only then is state.json read.
        after = sleep_after_of(handle.record, self.config)
        return due(handle.record, handle.called_at, after, now) and due(_freshest(handle), handle.called_at, after, now)

    async def _sleep(self, handles: list[Handle]) -> None:
        for handle in handles:
            after = sleep_after_of(handle.record, self.config)
            try:
                slept = await self.pausing.put_to_sleep(handle, after)
            except ApiError as exc:
                self.not_before[handle.id] = time.time() + after
                level = logging.DEBUG if (exc.extra or {}).get("reason") in (V.PAUSE_BUSY, V.PAUSE_USED_SINCE) \
                    else logging.WARNING
                log.log(level, "sandbox %s not put to sleep: %s", handle.id, exc.message)
            except Exception:
                self.not_before[handle.id] = time.time() + after
                log.exception("sandbox %s not put to sleep", handle.id)
            else:
                if slept:
                    log.info("sandbox %s asleep: no call for %d s", handle.id, after)
