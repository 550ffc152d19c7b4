"""The warm pool: sandboxes started ahead of need, per image, and claimed by creates.

A pooled sandbox is nobody's yet: it is hidden from listings, counts against no capacity,
and is ended when the server stops or its image is removed. A create whose limits a pooled
sandbox can take (the same fixed limits; cgroup-set ones may change) claims it instead of
waiting for a start.

Each isolation tier has its own queues (``pool_size`` for bwrap, ``gvisor_pool_size`` for
gVisor): a gVisor sandbox boots its own kernel, about 2-4 s here against well under one for
bwrap, so a gVisor create that had to wait for that boot was the slow way into a notebook.
A pooled gVisor sandbox is made as a cold one is (its own uid, cgroup, workspace image and
runsc container) and claimed the same way; its ``pids`` is fixed at launch (the Sentry's
RLIMIT_NPROC in its bundle), so a create must ask for the pool's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from .config import ServiceConfig
from ..common.errors import ApiError
from ..isolation import gvisor
from .handles import Handle
from ..images.images import ImageStore
from .launcher import Launcher
from .registry import Registry
from ..runtime import vocabulary as V
from .supervisor_calls import SupervisorCalls

log = logging.getLogger("sandbox.core.manager")

# Limits a sandbox is started with and cannot change later; a pooled one must match them.
FIXED_LIMITS = ("disk_mb", "open_files", "tmp_mb", "shm_mb", "file_mb", "output_bytes", "timeout_seconds")


def compatible(limits: dict, record: dict) -> bool:
    """Whether a pooled sandbox (its record) can serve a create asking for ``limits``."""
    pooled = record.get("limits", {})
    if any(pooled.get(k) != limits.get(k) for k in FIXED_LIMITS):
        return False
    iso = record.get("isolation", {})
    for key, res in (("memory_mb", "memory"), ("pids", "pids"), ("cpus", "cpu")):
        if pooled.get(key) != limits.get(key) and not str(iso.get(res, "")).startswith("cgroup"):
            return False
    return True


class WarmPool:
    def __init__(self, config: ServiceConfig, images: ImageStore, registry: Registry, launcher: Launcher,
                 calls: SupervisorCalls, may_fill: Callable[[], bool]):
        self.config = config
        self.images = images
        self.registry = registry
        self.launcher = launcher
        self.calls = calls
        self.may_fill = may_fill  # False while the server stops or the node drains
        # tier -> image -> ids of its pooled sandboxes, oldest first
        self.tiers: dict[str, dict[str, deque[str]]] = {V.BWRAP: {}, V.GVISOR: {}}
        self._refill = asyncio.Event()

    @property
    def queues(self) -> dict[str, deque[str]]:
        """The bwrap tier's queues (the default tier)."""
        return self.tiers[V.BWRAP]

    def target(self, image: str, backend: str = V.BWRAP) -> int:
        if backend == V.GVISOR:
            if image != self.config.default_image or self.config.gvisor_pool_size <= 0:
                return 0
            return self.config.gvisor_pool_size if gvisor.available()[0] else 0
        if image in self.config.pool_sizes:
            return int(self.config.pool_sizes[image])
        return self.config.pool_size if image == self.config.default_image else 0

    def add(self, image: str, sandbox_id: str, backend: str = V.BWRAP) -> None:
        """A pooled sandbox found again after a restart."""
        self.tiers[backend].setdefault(image, deque()).append(sandbox_id)

    def take_image(self, image: str) -> list[str]:
        """Forget an image's queues (its image goes); the ids they held, for the caller to end."""
        return [i for queues in self.tiers.values() for i in queues.pop(image, [])]

    def refill_soon(self) -> None:
        self._refill.set()

    async def keep(self) -> None:
        """Fill every image's queue up to its target, again after each claim or build."""
        while not self.calls.shutting_down.is_set():
            try:
                await self._fill()
            except ApiError as exc:
                log.warning("could not fill the warm pool: %s", exc.message)
                await asyncio.sleep(5)
            except Exception:
                log.exception("pool refill failed")
                await asyncio.sleep(5)
            self._refill.clear()
            try:
                await asyncio.wait_for(self._refill.wait(), 2.0)
            except asyncio.TimeoutError:
                pass

    async def _fill(self) -> None:
        """The bwrap tier first (its sandboxes start fastest and most creates ask for it)."""
        for backend, queues in self.tiers.items():
            for info in self.images.list():
                image = info["name"]
                queues[image] = deque(i for i in queues.get(image, ()) if i in self.registry.live)
                while len(queues[image]) < self.target(image, backend) and self.may_fill():
                    limits = self.config.default_limits()
                    handle = await self.launcher.spawn(image, limits, self.config.pool_idle_seconds,
                                                       self.config.pool_idle_seconds, pooled=True, isolation=backend)
                    queues[image].append(handle.id)

    def status(self) -> dict:
        """Per image, the bwrap tier's count, and the gVisor tier's under ``gvisor`` where it has one."""
        def count(queue) -> int:
            return len([i for i in queue if i in self.registry.live])

        out = {name: {"ready": count(q), "target": self.target(name),
                      "preload": (self.images.get(name) or {}).get("preload", [])}
               for name, q in self.queues.items()}
        for name, q in self.tiers[V.GVISOR].items():
            if q or self.target(name, V.GVISOR):
                entry = out.setdefault(name, {"ready": 0, "target": self.target(name),
                                              "preload": (self.images.get(name) or {}).get("preload", [])})
                entry[V.GVISOR] = {"ready": count(q), "target": self.target(name, V.GVISOR)}
        return out

    async def claim(self, image: str, limits: dict, claim: dict, backend: str = V.BWRAP) -> Handle | None:
        """A pooled sandbox of ``image`` and ``backend`` made the caller's by the ``claim`` request, or None."""
        queue = self.tiers[backend].get(image)
        while queue:
            sandbox_id = queue.popleft()
            handle = self.registry.live.get(sandbox_id)
            if handle is None or not compatible(limits, handle.record):
                if handle is not None:
                    queue.append(sandbox_id)
                    return None
                continue
            try:
                await self.calls.call(handle, claim)
            except ApiError:
                self.registry.check(handle)
                continue
            handle.record["from_pool"] = True
            return handle
        return None
