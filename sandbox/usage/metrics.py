"""Prometheus metrics of a node server, with the official client library (``prometheus_client``).

Two kinds: what the API counts as it answers (creates, executes and their latency, pause,
resume and fork times) in the library's own Counter and Histogram, and what is read at
scrape time from the manager, the egress proxy and the usage records (sandboxes by state
and tier, the warm pool, egress, usage totals), in a collector. The process collector adds
the server's own memory, CPU and open descriptors. One registry per server: tests and the
gateway run several in one process.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter as Tally
from typing import TYPE_CHECKING, AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..runtime import vocabulary as V
from . import store as usage_store

if TYPE_CHECKING:
    from ..core.manager import SandboxManager

PREFIX = "sandbox_kernel"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# An execute's latency: a trivial cell takes milliseconds, a notebook's heavy cell minutes.
EXECUTE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
LIFECYCLE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The usage records' totals, each a counter (name, help).
USAGE_COUNTERS = {
    "cpu_seconds": "CPU time used by sandboxes (their usage records)",
    "memory_gib_hours": "Memory held by sandboxes over time, GiB-hours",
    "disk_gib_hours": "Workspace disk used by sandboxes over time, GiB-hours",
    "executes": "Cells run by sandboxes (their usage records)",
    "commands": "Commands run by sandboxes (their usage records)",
    "egress_bytes_in": "Bytes received through the egress proxy (usage records of ended sandboxes)",
    "egress_bytes_out": "Bytes sent through the egress proxy (usage records of ended sandboxes)",
}


class ServerMetrics:
    """The node server's registry and the instruments its API handlers feed."""

    def __init__(self, manager: "SandboxManager"):
        self.registry = CollectorRegistry()
        r = self.registry
        self.creates = Counter(f"{PREFIX}_creates", "Sandboxes created", ["tier", "from_pool"], registry=r)
        self.executes = Counter(f"{PREFIX}_executes", "Cells run through the API, by how they ended", ["status"],
                                registry=r)
        self.execute_seconds = Histogram(f"{PREFIX}_execute_seconds", "Time from an execute's request to its done",
                                         buckets=EXECUTE_BUCKETS, registry=r)
        self.lifecycle_seconds = Histogram(f"{PREFIX}_lifecycle_seconds", "Time a pause, resume or fork took",
                                           ["operation"], buckets=LIFECYCLE_BUCKETS, registry=r)
        ProcessCollector(namespace=PREFIX, registry=r)
        r.register(LiveCollector(manager))

    def created(self, sandbox: dict) -> None:
        tier = (sandbox.get("isolation") or {}).get("backend") or V.BWRAP
        self.creates.labels(tier=tier, from_pool=str(bool(sandbox.get("from_pool"))).lower()).inc()

    async def timed_execute(self, events: AsyncIterator[dict]) -> AsyncIterator[dict]:
        """Pass an execute's events through, counting it by its done's status and timing it."""
        started, status = time.monotonic(), "incomplete"
        try:
            async for event in events:
                if event.get("type") == V.DONE:
                    status = event.get("status") or V.ERROR
                yield event
        finally:
            self.executes.labels(status=status).inc()
            self.execute_seconds.observe(time.monotonic() - started)

    @contextlib.contextmanager
    def timing(self, operation: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.lifecycle_seconds.labels(operation=operation).observe(time.monotonic() - started)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LiveCollector:
    """What is read at scrape time: nothing here is counted twice, nor kept in between."""

    def __init__(self, manager: "SandboxManager"):
        self.manager = manager

    def collect(self):
        manager = self.manager
        states = GaugeMetricFamily(f"{PREFIX}_sandboxes", "Sandboxes by state and isolation tier (pooled ones "
                                   "are the warm pool)", labels=["state", "tier"])
        tally = Tally(((h.record.get("state") or "unknown"), (h.record.get("isolation") or {}).get("backend") or V.BWRAP)
                      for h in manager.live.values())
        for (state, tier), count in sorted(tally.items()):
            states.add_metric([state, tier], count)
        yield states
        if manager.config.metrics_owner_label:
            yield self.by_owner()
        pool = GaugeMetricFamily(f"{PREFIX}_pool_ready", "Warm sandboxes ready, by image", labels=["image"])
        target = GaugeMetricFamily(f"{PREFIX}_pool_target", "Warm sandboxes wanted, by image", labels=["image"])
        for image, status in sorted(manager.pool_status().items()):
            pool.add_metric([image], status["ready"])
            target.add_metric([image], status["target"])
        yield pool
        yield target
        egress = manager.egress.totals()
        yield CounterMetricFamily(f"{PREFIX}_egress_requests", "Requests through the egress proxy", egress["requests"])
        yield CounterMetricFamily(f"{PREFIX}_egress_refusals", "Requests the egress proxy refused", egress["refused"])
        totals = manager.usage_store.totals()
        for name, text in USAGE_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_usage_{name}", text, totals[name])
        yield GaugeMetricFamily(f"{PREFIX}_usage_records", "Usage records kept", totals["records"])

    def by_owner(self) -> GaugeMetricFamily:
        """Live sandboxes (the warm pool's left out: nobody owns them yet) by their owner's
        name, as the usage records name owners."""
        family = GaugeMetricFamily(f"{PREFIX}_sandboxes_by_owner", "Sandboxes by owner (metrics_owner_label)",
                                   labels=["owner"])
        tally = Tally(usage_store.owner_name(self.manager.owner_of(sandbox_id))
                      for sandbox_id, h in self.manager.live.items() if h.record.get("state") != V.POOLED)
        for owner, count in sorted(tally.items()):
            family.add_metric([owner], count)
        return family
