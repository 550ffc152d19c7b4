"""The sandbox service: create, find, renew, pause, fork, delete; the parts that do each, put together.

``SandboxManager`` is what the HTTP handlers hold (``request.app.state.manager``). It owns
no state of a sandbox of its own; each job has one part:

- ``registry.Registry``: the live and ended sandboxes, and filing one as ended;
- ``supervisor_calls.SupervisorCalls``: requests to a supervisor, execute and command streams;
- ``launcher.Launcher``: a sandbox's directory, spec, uid and supervisor process;
- ``warm_pool.WarmPool``: sandboxes started ahead of need, claimed by creates;
- ``admission``: the gate (stopping, draining) and the capacity claimed sandboxes hold;
- ``pause_resume.PauseResume``: checkpoints, restores and forks (gVisor);
- ``reaper.Reaper``: the once-a-second clock (ended supervisors, paused lifetimes, tombstones);
- ``sleeper.Sleeper``: idle gVisor sandboxes paused after ``gvisor_sleep_after_seconds`` (kept bwrap ones
  put to sleep by value, value_sleep.py);
- ``readoption.Readoption``: taking back, after a restart, what a previous server left;
- ``saving.StateSaving``: namespaces saved by value into ``saves.SaveStore``, and loaded back;
- ``end_saver.EndSaver``: sandboxes with a ``save_label`` saved so before their TTL or the stop ends them.

Each sandbox's supervisor writes ``state.json`` and serves a control socket, so after a
server restart the registry is rebuilt from the state directory (see readoption.py).
"""

from __future__ import annotations

import asyncio
import logging

from . import handles
from .admission import CapacityLedger, Gate
from .config import ServiceConfig
from ..egress import service as egress_service
from ..common.errors import ApiError
from .handles import Handle
from ..images import registry as image_registry
from ..images.images import ImageStore
from .launcher import Launcher, choose_backend
from ..common.paths import StateDir
from .pause_resume import PauseResume
from .readoption import Readoption, sandboxes_left
from .reaper import Reaper
from .saves import SaveStore
from .saving import StateSaving
from .end_saver import EndSaver
from .memory_pressure import MemoryPressure
from .sleeper import Sleeper
from .value_sleep import ValueSleep
from .registry import Registry
from ..runtime import vocabulary as V
from .supervisor_calls import SupervisorCalls
from .tenancy import Link, Tenancy
from ..usage import store as usage_store
from .warm_pool import WarmPool

log = logging.getLogger("sandbox.core.manager")

__all__ = ["Handle", "SandboxManager"]


class SandboxManager:
    def __init__(self, config: ServiceConfig):
        self.config = config
        self.state_dir = StateDir(config.state_dir)
        self.images = ImageStore(self.state_dir)
        self.tenancy = Tenancy()
        self.egress = egress_service.from_config(config)
        self.usage_store = usage_store.UsageStore(usage_store.path_in(self.state_dir.root))
        self.gate = Gate(config)
        self.registry = Registry(self.egress, self.tenancy, self.usage_store)
        self.calls = SupervisorCalls(self.registry, self.gate.shutting_down)
        self.launcher = Launcher(config, self.state_dir, self.images, self.registry, self.egress)
        self.ledger = CapacityLedger(config, self.registry, self.state_dir.sandboxes)
        self.pool = WarmPool(config, self.images, self.registry, self.launcher, self.calls, self.gate.may_fill_pool)
        self.pausing = PauseResume(config, self.state_dir, self.registry, self.calls, self.launcher, self.gate,
                                   self.ledger)
        self.sleeper = Sleeper(config, self.registry, self.pausing)
        self.saves = SaveStore(self.state_dir.saves, config.saves_max_mb * 1024 * 1024)
        self.saving = StateSaving(config, self.saves, self.calls)
        self.end_saver = EndSaver(self.registry, self.saving, self.calls, self.tenancy, config.save_seconds)
        self.pausing.by_value = ValueSleep(self.saving, self.end_saver, self.calls, self.tenancy)
        self.pressure = MemoryPressure(config, self.registry, self.pausing, self.ledger)
        self.reaper = Reaper(self.state_dir, self.registry, self.pausing.end_paused, self.pausing.resting,
                             self._each_second)
        self.readoption = Readoption(self.state_dir, self.registry, self.calls, self.pool, self.egress,
                                     self._caller_exited)
        self.tasks: list[asyncio.Task] = []
        self.on_start: list = []  # coroutine functions run as tasks beside the reaper (the server's idle stop)
        self.protections: list[dict] = []  # the doctor report the server started with
        self.kept: list[str] = []  # sandboxes left running by stop(), for the server to report

    # ------------------------------------------------- what others read and set
    @property
    def live(self) -> dict[str, Handle]:
        return self.registry.live

    @property
    def ended(self) -> dict[str, dict]:
        return self.registry.ended

    @property
    def shutting_down(self) -> asyncio.Event:
        return self.gate.shutting_down

    @property
    def draining(self) -> bool:
        return self.gate.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.gate.draining = value

    # ------------------------------------------------------ startup, shutdown
    def prepare(self, progress=print) -> None:
        """Blocking start-up work: state layout, runtime copy, default image."""
        self.state_dir.ensure()
        self.launcher.prepare()
        if self.images.get(self.config.default_image) is None:
            progress("building the default image once (this takes a minute or two)")
            self.images.ensure_default(progress=progress)
        else:
            self.images.refresh_default(sandboxes_left(self.state_dir), progress=progress)

    async def start(self) -> None:
        self.launcher.start_template()  # before the pool's and re-adoption's first supervisors
        await self.readoption.adopt()
        self.tasks.append(asyncio.create_task(self.reaper.run()))
        self.tasks.append(asyncio.create_task(self.pool.keep()))
        self.tasks.extend(asyncio.create_task(make()) for make in self.on_start)

    async def stop(self) -> None:
        """End the warm pool (its sandboxes hold nobody's state) and, with
        delete_on_shutdown, every sandbox; record in `kept` those left running."""
        self.gate.shutting_down.set()
        for task in self.tasks:
            task.cancel()
        self.sleeper.stop()
        self.tenancy.close()
        self.end_saver.cancel()
        ending = [h for h in list(self.live.values())
                  if self.config.delete_on_shutdown or h.record.get("state") == V.POOLED]
        await self.end_saver.save_all_before_stop(ending)
        await asyncio.gather(*(self.end(h, "the server shut down") for h in ending), return_exceptions=True)
        self.kept = sorted(i for i, h in self.live.items() if h.record.get("state") != V.POOLED)
        await asyncio.to_thread(self.launcher.template.stop)  # its children, the kept sandboxes' supervisors, run on

    def _each_second(self, now: float) -> None:
        """The reaper's call each second: idle gVisor sandboxes to sleep, nearly expired ones saved."""
        self.sleeper.tick(now)
        self.end_saver.tick(now)

    # ---------------------------------------------------------------- lookups
    def get(self, sandbox_id: str) -> Handle:
        return self.registry.get(sandbox_id)

    def list(self) -> list[Handle]:
        return self.registry.claimed()

    def not_found(self, sandbox_id: str) -> ApiError:
        return self.registry.not_found(sandbox_id)

    def gone_error(self, sandbox_id: str) -> ApiError:
        return self.registry.gone_error(sandbox_id)

    def owner_of(self, sandbox_id: str) -> int | None:
        return self.tenancy.owner_of(sandbox_id)

    def describe(self, handle: Handle) -> dict:
        return handles.describe(handle, self.egress.describe(handle.id), self.sleeper.sleeps_at(handle))

    async def refresh(self, handle: Handle) -> dict:
        if handle.record.get("state") != V.PAUSED:  # a paused one has no supervisor to ask
            try:
                await self.calls.call(handle, {"op": "status"})
            except ApiError:
                recorded = handle.saved_record()
                if recorded.get("state") != V.PAUSED:  # it paused just now: its supervisor is leaving
                    raise
                handle.record = recorded
        return self.describe(handle)

    # ------------------------------------------------------ calls and streams
    async def call(self, handle: Handle, request: dict, timeout: float = 30.0) -> dict:
        return await self.calls.call(handle, request, timeout)

    async def open_execute(self, handle: Handle, request: dict, op: str = V.OP_EXECUTE):
        return await self.calls.open_execute(handle, request, op)

    async def open_command(self, handle: Handle, request: dict):
        return await self.calls.open_command(handle, request)

    # ------------------------------------------------------- create and end
    async def create(self, request: dict, owner: int | None = None, caller=None) -> dict:
        """``owner``: the tenant's uid on a shared server; ``caller``: the peer (pid) to end
        the sandbox with when the request asks for ``end_with_caller``."""
        self.gate.check()
        if request.get("from_save"):
            self.saves.get(owner, request["from_save"])  # 404 before anything is made
        image = request.get("image") or self.config.default_image
        if self.images.get(image) is None:
            raise ApiError(404, "not_found", f"no image named {image!r}; build it with: sandbox-kernel image build {image} --pip ...")
        egress = self.egress.parse(request["egress"], owner) if request.get("egress") is not None else None
        ttl = int(request.get("ttl_seconds") or self.config.ttl_seconds)
        max_life = int(request.get("max_lifetime_seconds") or self.config.max_lifetime_seconds)
        limits = self.ledger.limits_for(request)
        self.ledger.check(limits, ttl, max_life, owner)
        await self.pressure.make_room(limits)  # the host's real memory, idle gVisor sandboxes put to sleep for it
        ttl = min(ttl, max_life)
        backend = choose_backend(self.config, request)
        claim = {"op": "claim", "ttl_seconds": ttl, "max_lifetime_seconds": max_life,
                 "metadata": request.get("metadata") or {}, "limits": limits}
        with self.ledger.reserving(limits, owner):
            # A warm sandbox was launched without egress and ends when idle: a policy, or a
            # gVisor sandbox asked to pause when idle, needs a launch of its own.
            pooled_ok = egress is None and (request.get("on_idle") or V.ON_IDLE_DELETE) == V.ON_IDLE_DELETE
            handle = await self.pool.claim(image, limits, claim, backend) if pooled_ok else None
            if handle is None:
                handle = await self.launcher.spawn(image, limits, ttl, max_life, pooled=False,
                                                   metadata=claim["metadata"], egress=egress, owner=owner,
                                                   isolation=backend, on_idle=request.get("on_idle") or V.ON_IDLE_DELETE)
                handle.record["from_pool"] = False
        link = Link.of(caller.pid) if caller is not None and request.get("end_with_caller") else None
        self.tenancy.record(handle.id, handle.dir, owner, link)
        if link is not None or (caller is not None and request.get("end_with_caller")):
            self.tenancy.watch(handle.id, link or Link(caller.pid, -1), self._caller_exited)
        self.pool.refill_soon()
        view = self.describe(handle)
        if request.get("from_save"):
            view["restored"] = await self._restore_into(handle, owner, request["from_save"])
        return view

    async def _restore_into(self, handle: Handle, owner: int | None, save_id: str) -> dict:
        """A new sandbox's state from a save, loaded inside it; a failure is said, the sandbox kept."""
        try:
            return await self.saving.restore(handle, owner, save_id)
        except ApiError as exc:
            return {"error": exc.message}

    async def delete(self, sandbox_id: str, reason: str = "it was deleted") -> dict:
        handle = self.get(sandbox_id)  # 404/410 for unknown, ended and pooled ids
        await self.end(handle, reason)
        return {"id": sandbox_id, "state": V.DELETED}

    async def end(self, handle: Handle, reason: str) -> None:
        """Delete one sandbox, claimed or pooled, and wait until its processes are gone."""
        if self.pausing.resting(handle):
            await self.pausing.end_paused(handle, V.DELETED, reason)
            return
        try:
            await self.calls.call(handle, {"op": "delete", "message": reason})
        except ApiError:
            # Not asked: a supervisor still starting (a warm-pool refill when the server
            # stops) would otherwise run on for the whole wait below, then be killed.
            self.registry.terminate(handle)
        await self.registry.wait_for_exit(handle)
        if handle.id in self.live:  # the supervisor did not end: kill it and its sandbox
            self.registry.force_kill(handle)
            await self.registry.wait_for_exit(handle)

    def _caller_exited(self, sandbox_id: str, link: Link) -> None:
        handle = self.live.get(sandbox_id)
        if handle is None or self.gate.shutting_down.is_set():
            return
        log.info("sandbox %s: the process that created it (pid %d) exited; ending it", sandbox_id, link.pid)
        task = asyncio.get_running_loop().create_task(
            self.end(handle, f"the process that created it (pid {link.pid}) exited"))
        self.tasks.append(task)
        task.add_done_callback(self.tasks.remove)

    # ------------------------------------------------------ pause and fork
    async def pause(self, handle: Handle) -> dict:
        await self.pausing.pause(handle)
        return self.describe(handle)

    async def wake(self, handle: Handle) -> str | None:
        return await self.pausing.wake(handle)

    async def fork(self, source: Handle, request: dict, owner: int | None = None) -> dict:
        if (source.record.get("isolation") or {}).get("backend") == V.GVISOR:  # others are refused in fork
            await self.pressure.make_room(dict(source.record.get("limits") or {}))  # a fork runs a copy of it
        return self.describe(await self.pausing.fork(source, request, owner))

    # ------------------------------------------------------ pool and images
    def pool_target(self, image: str) -> int:
        return self.pool.target(image)

    def pool_status(self) -> dict:
        return self.pool.status()

    def capacity_report(self) -> dict:
        return self.ledger.report()

    def in_use(self, image: str) -> int:
        return sum(1 for h in self.live.values()
                   if image in (h.image, (self.images.get(h.image) or {}).get("base")))

    async def build_image(self, name: str, *, progress, **recipe) -> dict:
        """Build (or rebuild) an image off the event loop; the warm pool then fills for it.
        ``progress`` is called from the building thread with each line of output."""
        try:
            return await asyncio.to_thread(self.images.build, name, progress=progress, **recipe)
        finally:
            self.pool.refill_soon()

    async def push_image(self, name: str) -> str:
        """Push an image to ``image_registry``, off the event loop: its manifest digest."""
        return await asyncio.to_thread(image_registry.push, self.images, name, self._registry())

    async def pull_image(self, name: str, digest: str | None) -> tuple[dict, str]:
        """Pull an image from ``image_registry`` (verified; see images/oci.py), off the event
        loop; the warm pool then fills for it."""
        try:
            return await asyncio.to_thread(image_registry.pull, self.images, name, self._registry(), digest)
        finally:
            self.pool.refill_soon()

    def _registry(self) -> str:
        if not self.config.image_registry:
            raise image_registry.RegistryError("this node has no image registry configured (serve --set "
                                         "image_registry=HOST:PORT)", code="no_registry")
        return self.config.image_registry

    def image_digests(self) -> dict[str, str]:
        """The digest each image here was pushed or pulled as: a gateway has nodes without it pull that."""
        return image_registry.digests(self.images)

    async def remove_image(self, name: str) -> None:
        """Remove an image no sandbox uses; its warm-pool sandboxes (nobody's yet) end with it.
        Raises ImageError (not_found, conflict) as the image store does."""
        self.images.remove(name, self.in_use)
        for sandbox_id in self.pool.take_image(name):
            if sandbox_id in self.live:
                await self.end(self.live[sandbox_id], "its image was removed")
