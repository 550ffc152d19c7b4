"""Pause, resume and fork of gVisor sandboxes: a checkpoint on disk instead of a process.

A paused sandbox has no supervisor: its record says ``paused``, its checkpoint and
workspace stay, and the next call that needs it running restores it (one restore at a
time per sandbox). A fork is a second sandbox laid out from a checkpoint (see
``forking.py``) and restored like any paused one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time

from ..isolation import checkpoints, disk, host
from . import forking
from ..common import statefile
from ..common.background import spawn
from .admission import CapacityLedger, Gate
from .config import ServiceConfig
from ..common.errors import ApiError
from .handles import Handle
from ..common.ids import new_sandbox_id
from .launcher import Launcher
from ..common.paths import StateDir
from .registry import Registry
from ..runtime import vocabulary as V
from .supervisor_calls import SupervisorCalls
from ..common.timeline import Timeline
from .value_sleep import ValueSleep, sleeps_by_value

log = logging.getLogger("sandbox.core.manager")

CHECKPOINT_WAIT = 660.0  # the supervisor gives runsc checkpoint 600 s


class PauseResume:
    def __init__(self, config: ServiceConfig, state_dir: StateDir, registry: Registry, calls: SupervisorCalls,
                 launcher: Launcher, gate: Gate, ledger: CapacityLedger):
        self.config = config
        self.state_dir = state_dir
        self.registry = registry
        self.calls = calls
        self.launcher = launcher
        self.gate = gate
        self.ledger = ledger
        self.waking: dict[str, asyncio.Lock] = {}  # per paused sandbox: one restore at a time
        self.by_value: ValueSleep | None = None  # the bwrap tier's sleep (set by the manager)

    async def pause(self, handle: Handle, holding_lock: bool = False) -> None:
        """Checkpoint a gVisor sandbox (see Supervisor.pause); its supervisor then exits.
        ``holding_lock``: the caller (a fork) holds its restore lock."""
        if not holding_lock:
            await self.settled(handle)
        if handle.record.get("state") == V.PAUSED:
            return
        await self._checkpoint(handle, {"op": "pause"})

    async def put_to_sleep(self, handle: Handle, idle_seconds: int) -> bool:
        """The sleeper's pause (sleeper.py): only if the sandbox had no call for
        ``idle_seconds`` (else the supervisor refuses: 409 ``used_since``, or ``busy``), and
        under its restore lock, so that a call arriving meanwhile waits for the pause and then
        wakes it (``wake``). False when a restore or a fork holds the lock, or it is not running."""
        lock = self.waking.setdefault(handle.id, asyncio.Lock())
        if lock.locked():
            return False
        async with lock:
            if handle.record.get("state") != V.RUNNING:
                return False
            if (handle.record.get("isolation") or {}).get("backend") != V.GVISOR:
                await self.by_value.put_to_sleep(handle, idle_seconds)
                await self.registry.wait_for_exit(handle)
                return True
            await self._checkpoint(handle, {"op": "pause", "by": V.PAUSED_BY_IDLE, "idle_seconds": idle_seconds,
                                            "message": f"no call for {idle_seconds} s"})
        return True

    async def _checkpoint(self, handle: Handle, request: dict) -> None:
        started = time.monotonic()
        await self.calls.call(handle, request, timeout=CHECKPOINT_WAIT)
        await self.registry.wait_for_exit(handle)
        _server_share(handle.record, "pause", time.monotonic() - started)

    async def settled(self, handle: Handle) -> None:
        """Wait for a restore under way (a source restored after its fork answered): a pause
        or a fork asked meanwhile acts on the sandbox as it will be, running."""
        lock = self.waking.get(handle.id)
        if lock is not None and lock.locked():
            async with lock:
                pass

    async def wake(self, handle: Handle, admitted: bool = False) -> str | None:
        """Restore a paused sandbox before a call that needs it running; a note saying so
        and how long the caller waited (for the execute stream), or None when it was not
        paused. Callers that arrive while a restore or a pause is under way wait for it (a
        sleeper's pause: then they wake it). ``admitted``: its room is already counted (a
        fork and the source it paused), so the capacity check is not made twice."""
        called = time.monotonic()
        handle.called_at = time.time()  # before any wait: the sleeper sees a call on its way
        await self.settled(handle)
        if handle.record.get("state") != V.PAUSED:
            return None
        lock = self.waking.setdefault(handle.id, asyncio.Lock())
        async with lock:
            if handle.record.get("state") != V.PAUSED:
                return None
            if not admitted:
                self.ledger.check_restore(handle)
            paused = handle.record
            checkpoint = paused.get("checkpoint") or {}
            log.info("restoring paused sandbox %s", handle.id)
            started = time.monotonic()
            ready = await self.launcher.start_supervisor(handle, "--restore")
            if not ready.get("ok"):
                await self.registry.wait_for_exit(handle)
                handle.record = handle.saved_record()
                if ready.get("reason") == V.RESTORE_VERSION_MISMATCH:
                    raise ApiError(409, "conflict", ready.get("error") or "version mismatch",
                                   extra={"reason": V.RESTORE_VERSION_MISMATCH})
                raise ApiError(503, "unavailable", f"the paused sandbox could not be restored: {ready.get('error')}")
            handle.record = ready["state"]
            _server_share(handle.record, "resume", time.monotonic() - started)
            if sleeps_by_value(paused):  # a new runtime: its namespace comes from the save
                return await self.by_value.load(handle, paused, called)
        return wake_note(paused, time.monotonic() - called)

    async def fork(self, source: Handle, request: dict, owner: int | None = None) -> Handle:
        """A second, independent sandbox restored from the source's checkpoint (see forking.py).

        A running source is paused first (the same checks as any pause: never mid-cell, never
        ``--leave-running``), and restored once the fork runs, after the answer (see
        ``_restore_source``); a paused one stays paused. The fork counts against the server's
        limits like a create: the source's limits, its own TTL and lifetime (the source's unless
        the request names them)."""
        spec = statefile.read_json(os.path.join(source.dir, "spec.json")) or {}
        if spec.get("isolation_backend") != V.GVISOR:
            raise ApiError(409, "conflict", "fork needs isolation 'gvisor': only a gVisor sandbox has a checkpoint "
                           "to restore twice (a bwrap sandbox's process lives on the host kernel, which cannot save "
                           "it); create the sandbox with isolation \"gvisor\"", extra={"reason": V.PAUSE_NOT_SUPPORTED})
        self.gate.check()
        limits = dict(source.record.get("limits") or spec["limits"])
        ttl = int(request.get("ttl_seconds") or source.record.get("ttl_seconds") or spec["ttl_seconds"])
        max_life = int(request.get("max_lifetime_seconds") or spec["max_lifetime_seconds"])
        self.ledger.check(limits, ttl, max_life, owner)
        ttl = min(ttl, max_life)
        await self.settled(source)
        was_running = source.record.get("state") != V.PAUSED
        timeline = Timeline("fork")
        source_held = contextlib.ExitStack()  # a running source keeps its place until it runs again
        if was_running:
            source_held.enter_context(self.ledger.reserving(limits, self.registry.tenancy.owner_of(source.id)))
        with source_held, self.ledger.reserving(limits, owner):
            try:
                fork = await self._lay_out_fork(source, was_running, request, ttl, max_life, owner, timeline)
            except ApiError:
                if was_running and source.record.get("state") == V.PAUSED:  # paused by us: back as it was
                    await asyncio.gather(self.wake(source, admitted=True), return_exceptions=True)
                raise
            timeline.restart()
            woken = await asyncio.gather(self.wake(fork, admitted=True), return_exceptions=True)
            _restore_steps(timeline, fork.record, timeline.mark("restore"))
            if was_running:
                self._restore_source(source, source_held.pop_all())
        fork.record["timeline"] = timeline.as_field()
        if isinstance(woken[0], BaseException):
            await self.end_paused(fork, V.DELETED, "its fork could not be restored")
            self.registry.forget(fork.id)
            shutil.rmtree(fork.dir, ignore_errors=True)
            raise woken[0]
        return fork

    def _restore_source(self, source: Handle, held: contextlib.ExitStack) -> None:
        """Restore a source its fork paused, in the background: the fork's caller waits for the
        fork only, and the two restores do not share the CPUs (side by side on this 2-core host,
        each took twice as long). A call to the source meanwhile waits for this restore (its
        lock); a failed one leaves the source paused, for its next call to try again. ``held``:
        the source's place in the server's totals, given back once it runs (or stays paused)."""

        async def restore() -> None:
            with held:
                try:
                    await self.wake(source, admitted=True)
                except Exception as exc:  # it stays paused; its next call tries again
                    log.warning("sandbox %s stays paused after its fork: %s", source.id, exc)

        spawn(restore())

    async def _lay_out_fork(self, source: Handle, was_running: bool, request: dict, ttl: int, max_life: int,
                            owner: int | None, timeline: Timeline) -> Handle:
        """Pause the source if it runs and lay out its fork as a paused sandbox, holding the
        source's restore lock: nothing may restore (and write to) the source meanwhile."""
        async with self.waking.setdefault(source.id, asyncio.Lock()):
            if was_running:
                try:
                    await self.pause(source, holding_lock=True)
                except ApiError as exc:  # the pause's refusal (busy, not_running, ...), said as the fork's
                    exc.message = f"the fork needs a checkpoint of sandbox {source.id}, and {exc.message}"
                    raise
                for step, seconds in (source.record.get("timeline") or {}).get("steps", []):
                    timeline.add(f"pause.{step}", seconds)
            if source.record.get("state") != V.PAUSED or source.supervisor_alive():
                raise ApiError(503, "unavailable", f"sandbox {source.id} did not come to rest after its checkpoint")
            fork_id = new_sandbox_id(self.config.node_id)
            d = self.state_dir.sandbox(fork_id)
            try:
                _, record = await asyncio.to_thread(forking.lay_out, source.dir, d, fork_id, ttl=ttl,
                                                    max_life=max_life, metadata=request.get("metadata"),
                                                    timeline=timeline)
            except (OSError, RuntimeError) as exc:
                disk.destroy(host.workspace_image(d))  # a workspace already in the store goes too
                shutil.rmtree(d, ignore_errors=True)
                raise ApiError(503, "unavailable", f"the fork could not be laid out: {exc}") from None
        fork = Handle(fork_id, d, source.image, source.uid, record=record)
        self.registry.live[fork_id] = fork
        self.registry.tenancy.record(fork_id, d, owner, None)
        return fork

    def resting(self, handle: Handle) -> bool:
        """Paused with no supervisor: ended by removing files, not by asking a process."""
        return handle.record.get("state") == V.PAUSED and not handle.supervisor_alive()

    async def end_paused(self, handle: Handle, state: str, message: str) -> None:
        """End a paused sandbox: nothing runs, so its record, checkpoint and workspace go."""
        record = handle.saved_record()
        V.advance(record, state, end_message=message)
        record["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statefile.write_json(os.path.join(handle.dir, "state.json"), record)
        await asyncio.to_thread(checkpoints.discard, handle.dir)
        self.registry.live.pop(handle.id, None)
        self.waking.pop(handle.id, None)
        self.registry.bury(handle.id, record, handle.dir)


def wake_note(paused: dict, waited: float) -> str:
    """What the first call after a pause says: that it waited for a restore, and how long; a
    sandbox put to sleep by idleness (sleeper.py) says so, since when and why."""
    checkpoint = paused.get("checkpoint") or {}
    size = (checkpoint.get("size_bytes") or 0) / 1e6
    if paused.get("paused_by") == V.PAUSED_BY_IDLE:
        return (f"[sandbox: it was asleep since {paused.get('paused_at')} ({paused.get('pause_message')}); woke in "
                f"{waited:.1f} s, restored from its checkpoint of {size:.1f} MB; variables kept]\n")
    return (f"[sandbox: restored from its checkpoint of {size:.1f} MB taken at {checkpoint.get('taken_at')}, "
            f"in {waited:.1f} s; variables kept]\n")


def _server_share(record: dict, operation: str, seconds: float) -> None:
    """Add to the supervisor's timeline what the server waited for besides its steps (its
    own calls, the supervisor's start or exit), so that the steps sum to the caller's wait."""
    timeline = Timeline.of(record, operation)
    timeline.add("server_and_process_exit" if operation == "pause" else "server_and_ready_line",
                 max(0.0, seconds - sum(s for _, s in timeline.steps)))
    record["timeline"] = timeline.as_field()


def _restore_steps(timeline: Timeline, fork_record: dict, seconds: float) -> None:
    """Replace the fork's ``restore`` step (the wall time of its restore) with the fork's own
    resume steps, and what was left over."""
    name, _ = timeline.steps.pop()
    steps = (fork_record.get("timeline") or {}).get("steps", []) if fork_record.get("state") != V.PAUSED else []
    for step, took in steps:
        timeline.add(f"{name}.{step}", took)
    timeline.add(f"{name}.other", max(0.0, seconds - sum(s for _, s in steps)))
