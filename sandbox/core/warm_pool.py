"""The warm pool: sandboxes started ahead of need, per image, and claimed by creates.

A pooled sandbox is nobody's yet: it is hidden from listings, counts against no capacity,
and is ended when the server stops or its image is removed. A create whose limits a pooled
sandbox can take (the same fixed limits; cgroup-set ones may change) claims it instead of
waiting for a start.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from .config import ServiceConfig
from ..common.errors import ApiError
from .handles import Handle
from ..images.images import ImageStore
from .launcher import Launcher
from .registry import Registry
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
        self.queues: dict[str, deque[str]] = {}  # image -> ids of its pooled sandboxes, oldest first
        self._refill = asyncio.Event()

    def target(self, image: str) -> int:
        if image in self.config.pool_sizes:
            return int(self.config.pool_sizes[image])
        return self.config.pool_size if image == self.config.default_image else 0

    def add(self, image: str, sandbox_id: str) -> None:
        """A pooled sandbox found again after a restart."""
        self.queues.setdefault(image, deque()).append(sandbox_id)

    def take_image(self, image: str) -> list[str]:
        """Forget an image's queue (its image goes); the ids it held, for the caller to end."""
        return list(self.queues.pop(image, []))

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
        for info in self.images.list():
            image = info["name"]
            queue = self.queues.setdefault(image, deque())
            self.queues[image] = deque(i for i in queue if i in self.registry.live)
            while len(self.queues[image]) < self.target(image) and self.may_fill():
                limits = self.config.default_limits()
                handle = await self.launcher.spawn(image, limits, self.config.pool_idle_seconds,
                                                   self.config.pool_idle_seconds, pooled=True)
                self.queues[image].append(handle.id)

    def status(self) -> dict:
        return {name: {"ready": len([i for i in q if i in self.registry.live]), "target": self.target(name),
                       "preload": (self.images.get(name) or {}).get("preload", [])}
                for name, q in self.queues.items()}

    async def claim(self, image: str, limits: dict, claim: dict) -> Handle | None:
        """A pooled sandbox of ``image`` made the caller's by the ``claim`` request, or None."""
        queue = self.queues.get(image)
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
