"""Whether a new sandbox may start: the server's gate (stopping, draining) and the capacity
its sandboxes hold.

A create or a fork passes here before anything is laid out: the gate refuses while the
server stops or the node drains, the ledger while the host cannot hold the request's
limits beside what live sandboxes (and the creates under way) hold. The arithmetic is
``capacity.py``'s; this part knows which sandboxes count.
"""

from __future__ import annotations

import asyncio
import contextlib

from . import capacity
from .config import ServiceConfig
from ..common.errors import ApiError
from ..isolation import host as host_paths
from .handles import Handle
from .registry import Registry
from ..runtime import vocabulary as V


class Gate:
    """Stopping and draining: the two states in which the server takes no new sandbox."""

    def __init__(self, config: ServiceConfig):
        self.node_id = config.node_id
        self.shutting_down = asyncio.Event()
        self.draining = config.draining  # no new sandboxes (nor pool refills); existing ones run out

    def check(self) -> None:
        """Refuse a new sandbox (a create or a fork) while the server stops or the node drains."""
        if self.shutting_down.is_set():
            raise ApiError(503, "unavailable", "the server is shutting down")
        if self.draining:
            raise ApiError(503, "unavailable", f"the node {self.node_id or 'server'} is draining: "
                           "it takes no new sandboxes", extra={"reason": V.NODE_DRAINING})

    def may_fill_pool(self) -> bool:
        return not self.shutting_down.is_set() and not self.draining


def held(record: dict, config=None) -> dict:
    """What a sandbox holds of the host: its limits with its memory request in place of its
    memory limit (``capacity.reserved``; without ``config``, the whole limit), or, when
    paused, its disk and its checkpoint (runsc's image of its memory, often hundreds of MB
    on the same disk)."""
    limits = record.get("limits") or {}
    if record.get("state") == V.PAUSED:
        checkpoint = int((record.get("checkpoint") or {}).get("size_bytes") or 0)
        return {"disk_mb": limits.get("disk_mb", 0) + -(-checkpoint // capacity.MiB)}
    return capacity.reserved(config, limits) if config is not None else limits


class CapacityLedger:
    """What claimed sandboxes hold, and the limits of the creates under way (counted as used),
    in all and per owner (a tenant of a --multi-user server holds at most its share)."""

    def __init__(self, config: ServiceConfig, registry: Registry, sandboxes_dir: str):
        self.config = config
        self.registry = registry
        self.sandboxes_dir = sandboxes_dir
        self.reserved: list[tuple[int | None, dict]] = []  # (owner, limits) of each create under way

    def limits_for(self, request: dict) -> dict:
        """A create's limits: the server's defaults, overridden by what the request names."""
        limits = self.config.default_limits()
        for key in ("memory_mb", "cpus", "pids", "disk_mb"):
            if request.get(key) is not None:
                limits[key] = request[key]
        limits["file_mb"] = max(int(limits["disk_mb"]), self.config.file_max_bytes // (1024 * 1024))
        return limits

    def check(self, limits: dict, ttl: int, max_life: int, owner: int | None = None) -> None:
        """Raise the 4xx/503 of ``capacity.check`` when the host cannot take these limits now
        (or, on a shared server, ``owner``'s share cannot)."""
        capacity.check(self.config, self.host(), limits, ttl, max_life, self.usage(), user=owner,
                       user_used=None if owner is None else self.usage(owner))

    def check_restore(self, handle: Handle) -> None:
        """Raise the 409 of ``capacity.check_room`` when a paused sandbox's restore would not
        fit: in all, or in its owner's share on a shared server. It holds its disk and its
        place among the sandboxes while paused, so it wants back only its memory, CPUs and
        processes."""
        limits = {key: (handle.record.get("limits") or {}).get(key) or 0 for key in capacity.RESOURCES}
        want = {**{key: float(limits[key]) for key in capacity.RESOURCES}, "disk_mb": 0.0, "sandboxes": 0}
        want["memory_mb"] = float(capacity.reserved(self.config, limits)["memory_mb"])
        owner = self.registry.tenancy.owner_of(handle.id)
        capacity.check_room(self.config, self.host(), limits, want, self.usage(), owner,
                            None if owner is None else self.usage(owner), what=f"the paused sandbox {handle.id} "
                            "to be restored (it stays paused; delete another sandbox to make room)")

    @contextlib.contextmanager
    def reserving(self, limits: dict, owner: int | None = None):
        """Count ``limits`` as used (by ``owner``) while a create or a fork is under way."""
        entry = (owner, limits)
        self.reserved.append(entry)
        try:
            yield
        finally:
            self.reserved.remove(entry)

    def host(self) -> capacity.Host:
        """The host now, its free disk less what live workspaces may still grow by."""
        committed = sum(capacity.unwritten_mb(host_paths.workspace_image(h.dir),
                                              (h.record.get("limits") or {}).get("disk_mb", 0))
                        for h in self.registry.live.values())
        return capacity.host_facts(self.sandboxes_dir, committed)

    def usage(self, owner: int | None = None) -> dict:
        """What live claimed sandboxes (and creates under way) hold, all of them or ``owner``'s;
        the warm pool is not counted."""
        mine = (lambda who: True) if owner is None else (lambda who: who == owner)
        claimed = [held(h.record, self.config) for h in self.registry.live.values()
                   if h.record.get("state") != V.POOLED and mine(self.registry.tenancy.owner_of(h.id))]
        return capacity.usage(claimed + [capacity.reserved(self.config, limits)
                                         for who, limits in self.reserved if mine(who)])

    def report(self) -> dict:
        host = self.host()
        return {"host": {"memory_mb": host.memory_mb, "cpus": host.cpus, "disk_free_mb": host.disk_free_mb},
                "maxima": capacity.per_sandbox(self.config, host),
                "defaults": {k: v for k, v in self.config.default_limits().items() if k in capacity.RESOURCES}
                | {"memory_request_mb": self.config.memory_request_mb, "ttl_seconds": self.config.ttl_seconds, "max_lifetime_seconds": self.config.max_lifetime_seconds},
                "capacity": capacity.report(self.config, host, self.usage())}
