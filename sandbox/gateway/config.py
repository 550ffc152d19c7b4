"""The gateway's settings, as traitlets, like the node server's (``sandbox.core.config``)."""

from __future__ import annotations

import os

from traitlets import Float, Int, List, Unicode, default
from traitlets.config import Configurable


class GatewayConfig(Configurable):
    host = Unicode("127.0.0.1", help="Address to listen on.").tag(config=True)
    port = Int(8780, help="TCP port to listen on.").tag(config=True)
    token = Unicode("", help="Bearer token clients must send (default: SANDBOX_KERNEL_TOKEN).").tag(config=True)
    node_token = Unicode("", help="Bearer token the gateway sends to nodes (default: "
                         "SANDBOX_KERNEL_NODE_TOKEN, else the gateway's own token).").tag(config=True)
    user_secret = Unicode("", help="Secret that user tokens are derived from (`sandbox-kernel user-token NAME`); "
                          "a user token reaches its user's sandboxes only (default: SANDBOX_KERNEL_USER_SECRET; "
                          "empty: no user tokens).").tag(config=True)

    nodes = List(Unicode(), help="Static discovery: node server URLs (http://HOST:PORT).").tag(config=True)
    dns_name = Unicode("", help="DNS discovery: a name whose A/AAAA records are the nodes "
                       "(a Kubernetes headless Service).").tag(config=True)
    dns_port = Int(8765, help="The nodes' port, for addresses found by DNS.").tag(config=True)
    dns_server = Unicode("", help="Resolver to ask, IP or IP:PORT, for --dns-name and for host names in --node "
                         "URLs (default: the system's).").tag(config=True)

    refresh_seconds = Float(2.0, help="How often discovery and every node's /v1/info are refreshed.").tag(config=True)
    node_timeout_seconds = Float(3.0, help="Connect timeout to a node, and the time its /v1/info may take.").tag(config=True)
    node_gone_seconds = Float(30.0, help="A node that has not answered (or left discovery) for this long is "
                              "gone: its sandboxes answer 410. Before that they answer 503, so that a node "
                              "that restarts is not declared gone.").tag(config=True)
    request_max_bytes = Int(1024 * 1024, help="Largest JSON request body.").tag(config=True)

    @default("token")
    def _token_default(self):
        return os.environ.get("SANDBOX_KERNEL_TOKEN", "")

    @default("user_secret")
    def _user_secret_default(self):
        return os.environ.get("SANDBOX_KERNEL_USER_SECRET", "")

    @default("node_token")
    def _node_token_default(self):
        return os.environ.get("SANDBOX_KERNEL_NODE_TOKEN", "") or self.token
