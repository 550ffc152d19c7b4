"""Admission by use: before a sandbox starts, the host's real free memory must hold its request.

Reservations count memory *requests* (capacity.py), so the server admits more sandboxes
than their limits would fit, as Kubernetes does: most sandboxes sit idle far below their
limit. What bounds them is then what they really use. So a create or a fork first looks at
the host's ``MemAvailable`` (and the server's memory cgroup, when it has a limit): if that,
less ``memory_reserve_mb`` kept free, cannot hold the new sandbox's request, the server
puts idle gVisor sandboxes to sleep (a checkpoint gives their memory back to the host;
their next call wakes them), the longest idle first, until it can. Only when none is left
to put to sleep is the sandbox refused (409 ``capacity_exceeded``, reason
``host_memory_short``), with the numbers that made it so. A bubblewrap sandbox has no
checkpoint, so it is never put to sleep here.
"""

from __future__ import annotations

import logging
import os

from . import capacity
from .admission import CapacityLedger
from .config import ServiceConfig
from .handles import Handle
from .pause_resume import PauseResume
from .registry import Registry
from .sleeper import last_call
from ..common.errors import ApiError
from ..isolation import cgroups
from ..runtime import vocabulary as V

log = logging.getLogger("sandbox.core.manager")

HOST_MEMORY_SHORT = "host_memory_short"
# A sandbox put to sleep for room must have had no call for this long (the supervisor
# refuses one used since): a sandbox in the middle of a conversation is left running.
IDLE_ENOUGH_SECONDS = 30


def available_mb() -> int:
    """Memory the host can still give without swapping: ``MemAvailable``, or what is left
    under the server's memory cgroup limit when that is smaller."""
    available = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) // 1024
                    break
    except OSError:
        return 0
    parent = cgroups.detect().parents.get("memory")
    try:
        with open(os.path.join(parent, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(parent, "memory.current")) as f:
            current = int(f.read().strip())
    except (OSError, TypeError, ValueError):
        return available
    if limit.isdigit():
        available = min(available, max(0, int(limit) - current) // capacity.MiB)
    return available


class MemoryPressure:
    """The real-memory check of creates and forks, and the sleep that makes room."""

    def __init__(self, config: ServiceConfig, registry: Registry, pausing: PauseResume, ledger: CapacityLedger,
                 available=available_mb):
        self.config = config
        self.registry = registry
        self.pausing = pausing
        self.ledger = ledger
        self.available = available

    def short_by(self, limits: dict) -> int:
        """How many MB the host lacks for a sandbox with these limits (0: it fits), the
        requests of the creates under way counted as taken (their memory is not in use yet)."""
        pending = sum(capacity.reserved(self.config, other)["memory_mb"] for _, other in self.ledger.reserved)
        want = capacity.reserved(self.config, limits)["memory_mb"] + self.config.memory_reserve_mb + pending
        return max(0, want - self.available())

    def sleepers(self) -> list[Handle]:
        """Running gVisor sandboxes that may be put to sleep, the longest idle first."""
        found = [h for h in self.registry.live.values() if h.record.get("state") == V.RUNNING
                 and (h.record.get("isolation") or {}).get("backend") == V.GVISOR]
        return sorted(found, key=lambda h: last_call(h.record, h.called_at) or 0.0)

    async def make_room(self, limits: dict) -> None:
        """Return once the host's real memory holds this sandbox's request; put idle gVisor
        sandboxes to sleep for it if need be; else refuse, saying why."""
        if not self.short_by(limits):
            return
        slept = 0
        for handle in self.sleepers():
            try:
                if await self.pausing.put_to_sleep(handle, IDLE_ENOUGH_SECONDS):
                    slept += 1
                    log.info("sandbox %s asleep: the host's memory ran short", handle.id)
            except ApiError as exc:  # busy, or used in the last seconds: the next one
                log.debug("sandbox %s not put to sleep for room: %s", handle.id, exc.message)
            if not self.short_by(limits):
                return
        request = capacity.reserved(self.config, limits)["memory_mb"]
        free = self.available()
        tried = f"; {slept} idle gVisor sandbox(es) were put to sleep for room" if slept else \
            "; no idle gVisor sandbox was left to put to sleep"
        raise ApiError(409, "capacity_exceeded",
                       f"the host's memory is short: {free} MB available, this sandbox's request is {request} MB "
                       f"(memory_request_mb) and {self.config.memory_reserve_mb} MB are kept free "
                       f"(memory_reserve_mb){tried}; delete or pause a sandbox to make room",
                       extra={"reason": HOST_MEMORY_SHORT, "available_mb": free, "request_mb": request,
                              "reserve_mb": self.config.memory_reserve_mb, "slept": slept})
