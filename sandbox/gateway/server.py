"""Starting the gateway: check its settings, then uvicorn until SIGTERM.

The gateway keeps nothing on disk and nothing that another replica lacks, so stopping it
loses nothing: a client's next call, through any replica, finds its sandbox on its node.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from .app import build_gateway_app
from .config import GatewayConfig
from .discovery import DnsNodes, StaticNodes, split_host_port
from .nodes import NodeTable


def node_source(config: GatewayConfig):
    if config.nodes and config.dns_name:
        raise ValueError("give either --node URLs or --dns-name, not both")
    if config.dns_name:
        if config.dns_server:
            split_host_port(config.dns_server)  # ValueError with the text at fault
        return DnsNodes(config.dns_name, config.dns_port, config.dns_server, timeout=config.node_timeout_seconds)
    if config.nodes:
        return StaticNodes(list(config.nodes))
    raise ValueError("no nodes: give --node URL (repeatable) or --dns-name NAME")


def serve_gateway(config: GatewayConfig, log_level: str = "info") -> int:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if not config.token:
        out("the gateway needs a token for its clients: set SANDBOX_KERNEL_TOKEN or --token")
        return 2
    try:
        source = node_source(config)
    except ValueError as exc:
        out(f"gateway: {exc}")
        return 2
    app = build_gateway_app(config, NodeTable(config, source))
    out(f"sandbox gateway on http://{config.host}:{config.port} (nodes: {source.describe()})")
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                  timeout_graceful_shutdown=10, access_log=log_level == "debug")).run()
    return 0
