"""The configurations a server refuses, told from the configuration alone: quick, and with
few imports, so that `serve` asks before anything else (sandbox/cli/service.py)."""

from __future__ import annotations

import os

from ..core.config import ServiceConfig
from ..isolation import testonly
from .endpoint import is_loopback


def config_refusal(config: ServiceConfig) -> str | None:
    """Why this configuration must not start, before anything is touched (or said: `serve`
    asks before it says a first build's plan, which would not be true of a server that refuses)."""
    tcp = config.tcp
    if tcp is not None and not is_loopback(tcp[0]) and not config.token:
        return (f"refusing to listen on {tcp[0]}: a non-loopback address needs an explicit token "
                "(set SANDBOX_KERNEL_TOKEN or --token)")
    if config.metrics_port and tcp is not None and config.metrics_port == tcp[1]:
        return (f"refusing to start: metrics_port {config.metrics_port} is the API's port; /metrics is open on "
                "metrics_port, so it must be a port of its own")
    conflicts = config.defaults_over_maxima()
    if conflicts:
        return "refusing to start: a default limit is over its maximum: " + "; ".join(conflicts)
    refusal = testonly.refusal(config)
    if refusal:
        return refusal
    if config.multi_user and os.geteuid() != 0:
        return ("refusing --multi-user as a non-root user: a shared server runs as root, so that each sandbox "
                "gets a uid of its own and cgroup limits; run it from the systemd unit in docs/teams.md")
    return None
