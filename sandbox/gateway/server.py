"""Starting the gateway: check its settings, then serve until SIGTERM.

One process, one event loop (uvloop): the relay listens on the front port
(``relay.py``); the Starlette app (``app.py``) is served by uvicorn on a unix socket in a
private temporary directory, reached only through the relay; the node table's refresh and
the watchdog (``watchdog.py``) run beside them and are shared by both.

The gateway keeps nothing on disk and nothing that another replica lacks, so stopping it
loses nothing: a client's next call, through any replica, finds its sandbox on its node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile

import uvicorn
import uvloop

from ..common.processes import pid_alive
from .app import build_gateway_app
from .config import GatewayConfig
from .discovery import DnsLookup, DnsNodes, StaticNodes, SystemLookup, split_host_port
from .nodes import NodeTable
from .pool import APP_KEEP_ALIVE_SECONDS
from .relay import Relay
from .watchdog import watch

# How long calls in flight may take to end after SIGTERM.
GRACE_SECONDS = 10
# The app's private socket directory: PRIVATE_PREFIX + the gateway's pid + "-" + random.
PRIVATE_PREFIX = "sbk-gateway-"


def remove_stale_private_dirs(tmp: str | None = None) -> list[str]:
    """A gateway ended by SIGKILL cannot remove its private directory: the next gateway to
    start on the host removes those of gateways that are gone (their pid in the name no
    longer runs), and only its own user's, so a directory someone else put there is never
    touched. Returns the paths removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    for name in os.listdir(tmp):
        pid = name[len(PRIVATE_PREFIX):].split("-", 1)[0] if name.startswith(PRIVATE_PREFIX) else ""
        path = os.path.join(tmp, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if pid.isdigit() and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def node_source(config: GatewayConfig):
    if config.nodes and config.dns_name:
        raise ValueError("give either --node URLs or --dns-name, not both")
    if config.dns_server:
        split_host_port(config.dns_server)  # ValueError with the text at fault
    if config.dns_name:
        return DnsNodes(config.dns_name, config.dns_port, config.dns_server, timeout=config.node_timeout_seconds)
    if config.nodes:
        # Host names in the URLs: resolved by --dns-server when given, else by the system.
        lookup = (DnsLookup(config.dns_server, config.node_timeout_seconds) if config.dns_server
                  else SystemLookup(config.node_timeout_seconds))
        return StaticNodes(list(config.nodes), lookup)
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
    out(f"sandbox gateway on http://{config.host}:{config.port} (nodes: {source.describe()})")
    uvloop.run(_serve(config, NodeTable(config, source), log_level))
    return 0


class _AppServer(uvicorn.Server):
    """uvicorn for the app; the signal that stops it first stops the relay taking clients."""

    def __init__(self, config: uvicorn.Config, on_exit):
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        asyncio.get_event_loop().call_soon_threadsafe(self.on_exit)
        super().handle_exit(sig, frame)


async def _serve(config: GatewayConfig, table: NodeTable, log_level: str) -> None:
    # uvicorn re-raises the signal that stopped it once it is done: let that find a handler
    # that does nothing, so that the relay's own shutdown below still runs.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    await table.refresh()  # serve knowing the nodes: a restarted gateway routes at once
    background = [asyncio.create_task(table.run()), asyncio.create_task(watch(table))]
    remove_stale_private_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-") as private:
        app_socket = os.path.join(private, "app.sock")
        relay = Relay(config, table, app_socket)
        fronts: list[asyncio.AbstractServer] = []
        app_server = _AppServer(uvicorn.Config(build_gateway_app(config, table), uds=app_socket, lifespan="off",
                                               log_level=log_level, access_log=log_level == "debug",
                                               timeout_graceful_shutdown=GRACE_SECONDS,
                                               timeout_keep_alive=APP_KEEP_ALIVE_SECONDS),
                                lambda: [front.close() for front in fronts])
        serving = asyncio.create_task(app_server.serve())
        try:
            while not app_server.started:  # the app first, so that the first client finds it
                if serving.done():
                    return await serving
                await asyncio.sleep(0.01)
            fronts.append(await asyncio.get_running_loop().create_server(relay.connection, config.host, config.port))
            await serving
        finally:
            for front in fronts:
                front.close()
            await relay.close(GRACE_SECONDS)
            for task in background:
                task.cancel()
            await table.close()
