"""The gateway's /metrics (prometheus_client): its nodes as it sees them, the sandboxes
each node last reported, and the gateway process's own memory and descriptors. Each
node's own metrics are scraped from the node (deploy/kubernetes/monitoring)."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..usage.metrics import PREFIX
from .nodes import NodeTable


class NodesCollector:
    def __init__(self, table: NodeTable):
        self.table = table

    def collect(self):
        summaries = [node.summary() for node in self.table.known()]
        states = GaugeMetricFamily(f"{PREFIX}_gateway_nodes", "Nodes behind this gateway, by state", labels=["state"])
        for state, count in sorted(Tally(s["state"] for s in summaries).items()):
            states.add_metric([state], count)
        yield states
        sandboxes = GaugeMetricFamily(f"{PREFIX}_gateway_node_sandboxes", "Sandboxes each node reported in its "
                                      "last answer", labels=["node"])
        for node in self.table.usable():
            sandboxes.add_metric([node.node_id or node.address], node.info.get("sandboxes") or 0)
        yield sandboxes


class GatewayMetrics:
    def __init__(self, table: NodeTable):
        self.registry = CollectorRegistry()
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        self.registry.register(NodesCollector(table))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
