"""A sandbox's life, as its supervisor sees it: start, watch, kill, end, tear down.

The supervisor composes the jobs that live beside this module: ``launch`` (host
resources and the backend's process), ``channel`` (the runtime's frames), ``execute``
and ``commands`` (the sessions a caller streams), ``deadlines``, ``control`` (the unix
socket the server talks to) and ``record`` (state.json).
"""

from __future__ import annotations

import asyncio
import os
import time

from ..common import statefile
from ..isolation.host import HostResources
from ..runtime import vocabulary as V
from ..common.timeline import Timeline
from .channel import RuntimeChannel
from .control import ControlServer, socket_path
from .deadlines import watch_deadlines
from .death import death_cause
from .launch import LaunchFailed, exit_code, launch
from .pausing import cpu_quota_back, forget_container, restored
from .record import StateRecord, iso
from .usage import UsageJob


class Supervisor:
    def __init__(self, sandbox_dir: str, restoring: bool = False):
        self.dir = sandbox_dir
        self.spec = statefile.read_json(os.path.join(sandbox_dir, "spec.json"))
        if self.spec is None:
            raise SystemExit(f"no spec.json in {sandbox_dir}")
        self.record = StateRecord(sandbox_dir, self.spec)
        # Restoring a paused sandbox: it keeps its record (times, count, limits, isolation).
        self.restoring = restoring
        self.pausing = False  # a checkpoint is under way: the container's exit is not a death
        if restoring:
            self.record.resume_from_disk()
        self.host = HostResources(sandbox_dir, self.spec)
        self.usage = UsageJob(self, restoring)
        self.finished = asyncio.Event()
        self.channel = RuntimeChannel(self.spec, self.finished, self.kill)
        self.exec_lock = asyncio.Lock()  # cells run one at a time, in the order they came
        self.proc: asyncio.subprocess.Process | None = None
        self.kill_reason: tuple[str, str] | None = None
        self.tasks: list[asyncio.Task] = []
        self.timeline: Timeline | None = None  # of a pause (its teardown included) or a restore

    def public_state(self) -> dict:
        fields = self.record.public()
        fields["executing"] = self.channel.cell is not None
        fields["commands_running"] = len(self.channel.commands)
        if self.host.cgroup is not None:
            fields["memory_bytes"] = self.host.cgroup.memory_usage()
        if self.proc is not None and self.proc.returncode is None:
            fields["usage"] = dict(self.usage.meter.sample())
        return fields

    async def start(self) -> None:
        started = time.monotonic()
        if self.restoring:
            self.timeline = Timeline("resume")
            self.timeline.add("supervisor_process_start", process_age())
        isolation = self.record["isolation"]
        await asyncio.to_thread(self.host.acquire, isolation, self.restoring)
        if self.host.cgroup is not None:
            self.record["cgroup_dirs"] = self.host.cgroup_dirs
        self.mark("cgroup_and_workspace_mount")
        # Asleep by value, there is no checkpoint: a new runtime starts (the server then loads
        # the save into it); its isolation, workspace and record are the sandbox's own.
        from_checkpoint = self.restoring and not self.record.get(V.BY_VALUE)
        if from_checkpoint and self.host.cgroup is not None:
            self.host.cgroup.lift_cpu()  # until the first answer: the restore is gVisor's work
        try:
            launched = await launch(self.dir, self.spec, self.host, isolation, restore=from_checkpoint)
        except LaunchFailed as failed:
            self.proc = failed.launched.proc  # for teardown to end
            raise
        self.mark("spawn_runsc_restore")
        self.proc = launched.proc
        reader, self.channel.writer = launched.channel
        if self.restoring:
            if not self.slept_with_ttl_left():
                self.record.touch()  # its idle time starts again now, not when it was paused
        if not from_checkpoint:
            self.record["runtime"] = {k: launched.ready.get(k) for k in ("python", "preloaded", "preload_failed")}
        if not self.restoring:
            V.advance(self.record, V.POOLED if self.record["pooled"] else V.RUNNING)
            if self.record["state"] == V.RUNNING:
                # The TTL counts from when the sandbox can take a cell, not from when its boot
                # began: a cold start on a busy host may take longer than a short TTL.
                self.record.touch()
        self.tasks = [launched.log_task, asyncio.create_task(self.channel.read(reader)),
                      asyncio.create_task(self.watch_process()), asyncio.create_task(watch_deadlines(self)), asyncio.create_task(self.usage.run())]
        if self.restoring:
            try:
                await restored(self, started)
            finally:
                cpu_quota_back(self)
            self.mark("runsc_restore_and_first_ping")
            self.record["timeline"] = self.timeline.as_field()

    def slept_with_ttl_left(self) -> bool:
        """Put to sleep by idleness with TTL left: waking is not a use, so its TTL runs on
        as if it had stayed up (the call that woke it renews it, if it is an execute)."""
        return (self.record.get("paused_by") == V.PAUSED_BY_IDLE
                and time.time() < statefile.epoch(self.record["expires_at"]))

    def mark(self, step: str) -> None:
        """Close a step of the pause or restore under way (none: nothing to time)."""
        if self.timeline is not None:
            self.timeline.mark(step)

    async def serve(self, ready_fd: int | None) -> None:
        await ControlServer(self).serve(ready_fd)
        await self.teardown()

    async def watch_process(self) -> None:
        code = await self.proc.wait()
        if self.pausing:
            return  # the container stopped because it was checkpointed (see `pausing`)
        reason, message = self.kill_reason or death_cause(code, self.host, self.spec["limits"],
                                                          self.record["isolation"])
        self.record["exit_code"] = code
        if self.record["state"] in V.LIVE_STATES:
            if reason in (V.EXPIRED, V.DELETED):
                V.advance(self.record, reason)
            else:
                V.advance(self.record, V.DEAD, dead_reason=reason, dead_message=message)
        self.record.save()
        await self.channel.close(reason, message)
        self.finished.set()

    async def kill(self, reason: str, message: str) -> None:
        if self.kill_reason is None:
            self.kill_reason = (reason, message)
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        await asyncio.to_thread(self.host.kill_processes)
        if self.proc is not None:
            await exit_code(self.proc, 10.0)

    async def end(self, state: str, message: str) -> None:
        """Kill the sandbox for good and record why (expired or deleted)."""
        if self.record["state"] in V.ENDED_STATES:
            return
        V.advance(self.record, state, end_message=message)
        self.record.save_if_possible()
        await self.kill(state, message)
        self.finished.set()

    async def teardown(self) -> None:
        paused = self.record["state"] == V.PAUSED  # its workspace and checkpoint stay for the restore
        if not paused:
            self.timeline = None
        self.mark("answer")
        if self.proc is not None and self.proc.returncode is None:
            await self.kill(*(self.kill_reason or (V.KILLED, "the supervisor ended")))
        self.usage.finish()
        await asyncio.to_thread(self.host.release, paused)
        if paused:
            self.record.pop("cgroup_dirs", None)  # released: a later server has nothing to clean up
        self.mark("cgroup_and_workspace_release")
        if self.spec.get("isolation_backend") == V.GVISOR:
            await asyncio.to_thread(forget_container, self.dir, paused)
            self.mark("forget_container")
        self.record["ended_at"] = iso(time.time())
        await asyncio.to_thread(self.usage.write, not paused)
        self.mark("usage_write")
        if self.timeline is not None:
            self.record["timeline"] = self.timeline.as_field()
        self.record.save_if_possible()
        try:
            os.unlink(socket_path(self.dir))
        except FileNotFoundError:
            pass


def process_age() -> float:
    """Seconds since this process started (the interpreter's start and our imports, which a
    restore waits for): /proc's start time, in clock ticks since boot."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
