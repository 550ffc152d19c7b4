"""Pausing a gVisor sandbox, and confirming one restored.

A pause checkpoints the container to the state directory (``runsc checkpoint``, which
also stops it), records what the checkpoint was taken under, moves the sandbox to
``paused`` and lets the supervisor exit: nothing of the sandbox runs any more, its memory
is on disk. The server starts a new supervisor with ``--restore`` on the next call.

A pause is refused (with a reason from the vocabulary) unless the sandbox is a gVisor
one, running and idle: a checkpoint taken mid-cell would leave its caller waiting on a
process that is gone. Nothing is ever attached with ``runsc exec`` and no host socket is
bound inside, the two states runsc cannot restore; ``--leave-running`` (which hangs in this
release) is never used. A failed checkpoint is reported as one: the sandbox keeps running if
it still runs, and is recorded dead if it does not.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time

from ..isolation import checkpoints
from ..common import statefile
from ..isolation import gvisor
from ..common.timeline import Timeline
from ..runtime import vocabulary as V
from .core import SupervisorCore
from .launch import exit_code, log_tail

CHECKPOINT_TIMEOUT = 600.0
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def refusal(supervisor: SupervisorCore, holding_lock: bool = False, idle_seconds: float | None = None,
            by_value: bool = False) -> dict | None:
    """The refusal a pause gets now, or None if the sandbox may pause. ``idle_seconds``: only
    if it had no call for that long (the sleeper's pause; the server's view of the last call
    may be a second old, this record's is not). ``by_value``: a bwrap sandbox's sleep, its
    namespace already saved by the server."""
    record, channel = supervisor.record, supervisor.channel
    why = None
    if supervisor.spec.get("isolation_backend") != V.GVISOR and not by_value:
        why = V.PAUSE_NOT_SUPPORTED, ("only gvisor sandboxes can pause (a bwrap sandbox's process lives on the host "
                                      "kernel, which cannot save it); create one with isolation \"gvisor\"")
    elif record["state"] != V.RUNNING or supervisor.finished.is_set():
        why = V.PAUSE_NOT_RUNNING, f"the sandbox is {record['state']}, not running"
    elif channel.cell is not None or (supervisor.exec_lock.locked() and not holding_lock):
        why = V.PAUSE_BUSY, "a cell is running; pause when it is done (or interrupt it)"
    elif channel.commands:
        why = V.PAUSE_BUSY, f"{len(channel.commands)} command(s) are running; pause when they are done"
    elif idle_seconds is not None and record.get("used_at") and \
            time.time() - statefile.epoch(record["used_at"]) < idle_seconds:
        why = V.PAUSE_USED_SINCE, f"it was used at {record['used_at']}, less than {idle_seconds:g} s ago"
    if why is None:
        return None
    return {"error": "conflict", "reason": why[0], "message": f"the sandbox cannot pause: {why[1]}"}


async def pause(supervisor: SupervisorCore, why: str, by: str = V.PAUSED_BY_REQUEST,
                idle_seconds: float | None = None) -> dict:
    """Checkpoint and stop the sandbox; the control server's reply (``ok`` or a refusal).
    ``by``: who paused it (``paused_by``); ``idle_seconds``: see ``refusal``."""
    refused = refusal(supervisor, idle_seconds=idle_seconds)
    if refused is not None:
        return refused
    timeline = Timeline("pause")
    async with supervisor.exec_lock:  # no cell starts while the checkpoint is taken
        refused = refusal(supervisor, holding_lock=True, idle_seconds=idle_seconds)
        if refused is not None:
            return refused
        timeline.mark("wait_for_idle")
        # Files first: what a cell wrote may still sit in the Sentry's cache, which the
        # checkpoint saves but the workspace on disk (and so a fork's copy) would not hold;
        # a restore that finds the file older on disk drops the cache and the data with it.
        # (A runtime restored from an older checkpoint answers "unknown op": it pauses as before.)
        try:
            await supervisor.channel.request({"op": V.OP_SYNC}, timeout=120.0)
        except (TimeoutError, RuntimeError) as exc:
            return await _failed(supervisor, f"the sandbox did not write its files to disk: {exc}")
        timeline.mark("sync_files")
        binary = gvisor.discover()
        staged = checkpoints.staging_path(supervisor.dir)
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged, mode=0o700)
        cgroup = supervisor.host.cgroup
        memory = cgroup.memory_usage() if cgroup is not None else None
        started = time.monotonic()
        if cgroup is not None:
            cgroup.lift_cpu()  # runsc's work, not the code's: the Sentry stops its tasks first
        timeline.mark("prepare")
        supervisor.pausing = True
        proc = await asyncio.create_subprocess_exec(
            *gvisor.checkpoint_argv(binary, supervisor.dir, supervisor.spec, staged), env=RUNSC_ENV,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), CHECKPOINT_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            out = f"runsc checkpoint did not finish within {CHECKPOINT_TIMEOUT:.0f} s".encode()
        if proc.returncode != 0:
            return await _failed(supervisor, out.decode("utf-8", "replace").strip()[-600:])
        timeline.mark("runsc_checkpoint")
        if await exit_code(supervisor.proc, 30.0) is None:  # a checkpointed container stops by itself
            supervisor.proc.kill()
            await exit_code(supervisor.proc, 10.0)
        timeline.mark("container_exit")
        record = checkpoints.commit(supervisor.dir, runsc_version=binary.version, spec=supervisor.spec,
                                    rootfs_version=supervisor.record["isolation"].get("rootfs_version"),
                                    seconds=time.monotonic() - started, memory_bytes=memory)
        timeline.mark("commit_checkpoint")
        V.advance(supervisor.record, V.PAUSED, paused_at=statefile.iso(time.time()), pause_message=why, paused_by=by,
                  checkpoint={k: record[k] for k in ("taken_at", "size_bytes", "seconds", "runsc_version",
                                                     "memory_bytes_before", "rootfs_version")})
        supervisor.record["timeline"] = timeline.as_field()
        supervisor.record.save()
        timeline.mark("save_record")
        supervisor.timeline = timeline  # the teardown adds its steps (see Supervisor.teardown)
        return {"ok": True, "state": supervisor.public_state()}


async def sleep_by_value(supervisor: SupervisorCore, why: str, idle_seconds: float, saved: dict) -> dict:
    """A bwrap sandbox put to sleep by value: its namespace is in the save ``saved`` (made by the
    server just before, under this same idleness); end its processes and record it paused with
    that save, so that the server's next call starts a new runtime here and loads it. Refused,
    like a checkpoint, if a call came since (the save would miss what it did)."""
    refused = refusal(supervisor, idle_seconds=idle_seconds, by_value=True)
    if refused is not None:
        return refused
    async with supervisor.exec_lock:
        refused = refusal(supervisor, holding_lock=True, idle_seconds=idle_seconds, by_value=True)
        if refused is not None:
            return refused
        supervisor.pausing = True  # the process's end below is the sleep, not a death
        supervisor.proc.kill()
        await asyncio.to_thread(supervisor.host.kill_processes)
        await exit_code(supervisor.proc, 10.0)
        V.advance(supervisor.record, V.PAUSED, paused_at=statefile.iso(time.time()), pause_message=why,
                  paused_by=V.PAUSED_BY_IDLE, **{V.BY_VALUE: saved})
        supervisor.record.save()
        return {"ok": True, "state": supervisor.public_state()}


def cpu_quota_back(supervisor: SupervisorCore) -> None:
    """The sandbox's CPU quota again, after runsc's checkpoint or restore ran without it
    (``SandboxCgroup.lift_cpu``)."""
    cgroup = supervisor.host.cgroup
    if cgroup is not None:
        cgroup.set_limits(None, None, supervisor.spec["limits"].get("cpus"))


async def _failed(supervisor: SupervisorCore, detail: str) -> dict:
    shutil.rmtree(checkpoints.staging_path(supervisor.dir), ignore_errors=True)
    supervisor.pausing = False
    cpu_quota_back(supervisor)
    if await exit_code(supervisor.proc, 0.5) is None:
        message = f"the checkpoint failed, the sandbox keeps running: {detail}"
    else:  # the container went down with it: recorded as the death it is
        message = f"the checkpoint failed and stopped the sandbox; its variables are gone: {detail}"
        supervisor.kill_reason = supervisor.kill_reason or (V.CRASHED, message)
        supervisor.tasks.append(asyncio.create_task(supervisor.watch_process()))
    print(f"supervisor: {message}", file=sys.stderr, flush=True)
    return {"error": "conflict", "reason": V.PAUSE_FAILED, "message": message}


async def restored(supervisor: SupervisorCore, started: float) -> None:
    """A restored runtime sends no `ready` (it was running when it was saved): ask it."""
    try:
        await supervisor.channel.request({"op": V.OP_PING}, timeout=180.0)
    except Exception as exc:
        raise RuntimeError(f"the sandbox did not come back from its checkpoint ({exc or type(exc).__name__}): "
                           f"{log_tail(supervisor.dir)}") from None
    record = supervisor.record
    V.advance(record, V.RUNNING, paused_at=None, paused_by=None, restore_error=None, **{V.BY_VALUE: None})
    record["restored_in_seconds"] = round(time.monotonic() - started, 3)
    record["restores"] = int(record.get("restores") or 0) + 1


def forget_container(sandbox_dir: str, paused: bool) -> None:
    """After the container's processes are gone: runsc's record of it, and (unless the
    sandbox is paused) its checkpoint."""
    gvisor.clear_container_state(sandbox_dir)
    if not paused:
        checkpoints.discard(sandbox_dir)
