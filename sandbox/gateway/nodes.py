"""The nodes a gateway knows: discovered addresses, each node's own ``/v1/info``, and the
map from node id to address that routes every sandbox call.

A candidate node is a discovery target (``discovery.Target``): a URL and the one address the
gateway connects to for it. It proves itself at that address before the node token goes
there, and every later call for it, the gateway's own (``pinned.py``) and the relayed ones
(``pool.NodeUpstream``), goes to that same address; a host name with several addresses is
several candidates, each proving itself.

Everything here is soft state, rebuilt from discovery and the nodes every few seconds, so a
restarted gateway relearns it and two gateways never need to agree. A node that stops
answering (or leaves discovery) is first *unavailable* (503: it may be restarting), and
*gone* after ``node_gone_seconds`` (410: its sandboxes will not come back).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import httpx

from ..common.errors import ApiError
from ..common.ids import node_of
from ..runtime import vocabulary as V
from . import identity
from .config import GatewayConfig
from .discovery import Target
from .pinned import pinned_client
from .pool import NodeUpstream

log = logging.getLogger("sandbox.gateway.nodes")

# Why a sandbox call gets no answer from its node: the error bodies' "reason".
NODE_GONE, NODE_UNAVAILABLE = V.NODE_GONE, V.NODE_UNAVAILABLE


@dataclass
class Node:
    target: Target              # the URL and the one address every connection for it goes to
    client: httpx.AsyncClient   # the gateway's own calls: /v1/info, create, list, drain
    upstream: NodeUpstream      # calls on a sandbox, relayed as they are (sandbox/gateway/relay.py)
    node_id: str | None = None
    info: dict = field(default_factory=dict)
    up: bool = False
    answered_at: float | None = None   # monotonic time of the last good /v1/info
    down_since: float | None = None    # monotonic time it was first seen not answering
    departed_at: float | None = None   # monotonic time it left discovery
    error: str = ""
    # Set while the node is down: open execute streams watch it, so that a node that
    # vanishes without closing its connections ends them instead of leaving them hanging.
    down_event: asyncio.Event = field(default_factory=asyncio.Event)
    # The relayed calls in flight on this node (sandbox/gateway/exchange.py): what the
    # watchdog ends when the node stops answering.
    calls: set = field(default_factory=set)
    # Adds the node token to the gateway's own calls once the address proved it is the node.
    bearer: identity.ProvenBearer | None = None

    @property
    def address(self) -> str:
        """The gateway's name for it: its key in the table, its logs and ``GET /v1/nodes``."""
        return self.target.label

    @property
    def draining(self) -> bool:
        return bool(self.info.get("draining"))

    def mark_up(self, info: dict) -> None:
        self.info, self.node_id, self.up = info, info.get("node_id"), True
        self.answered_at, self.down_since, self.error = time.monotonic(), None, ""
        self.down_event.clear()

    def mark_down(self, error: str) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.up, self.error = False, error
        self.down_event.set()
        if self.bearer is not None:  # back up, it proves itself again: the address may be another's by now
            self.bearer.proven = False

    def summary(self) -> dict:
        now = time.monotonic()
        lacks_id = (self.up and not self.node_id) or self.error == identity.NO_NODE_ID
        state = "no_node_id" if lacks_id else ("up" if self.up else "down")
        if self.up and self.draining:
            state = V.NODE_DRAINING
        return {
            "node_id": self.node_id, "address": self.address, "peer": self.target.peer, "state": state,
            "draining": self.draining, "capacity": self.info.get("capacity"), "pool": self.info.get("pool"),
            "version": self.info.get("version"),
            "seconds_since_answer": None if self.answered_at is None else round(now - self.answered_at, 1),
            "in_discovery": self.departed_at is None, "error": self.error or None,
        }


class NodeTable:
    def __init__(self, config: GatewayConfig, source):
        self.config = config
        self.source = source
        self.nodes: dict[str, Node] = {}      # by address
        self.by_id: dict[str, Node] = {}
        self.started = time.monotonic()
        self.refreshed = asyncio.Event()      # set once a first round has finished
        self.limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        self.claims = identity.Claims()

    # ----------------------------------------------------------------- refresh
    def _node(self, target: Target) -> Node:
        """The token goes only with calls to an address that proved it is the node, and
        both clients connect to that address alone."""
        bearer = identity.ProvenBearer(self.config.node_token)
        timeout = httpx.Timeout(120.0, connect=self.config.node_timeout_seconds)
        client = pinned_client(target, timeout=timeout, limits=self.limits, auth=bearer)
        return Node(target, client, self._upstream(target), bearer=bearer)

    def _upstream(self, target: Target) -> NodeUpstream:
        return NodeUpstream(target, self.config.node_token, self.config.node_timeout_seconds,
                            max_idle=self.limits.max_keepalive_connections)

    async def refresh(self) -> None:
        try:
            targets = await self.source.addresses()
        except Exception as exc:  # a discovery bug must not stop routing to the nodes we know
            log.warning("node discovery failed: %s", exc)
            targets = [n.target for n in self.nodes.values() if n.departed_at is None]
        now = time.monotonic()
        addresses = set()
        for target in targets:
            address = target.label
            addresses.add(address)
            node = self.nodes.get(address)
            if node is None:
                self.nodes[address] = self._node(target)
                log.info("discovered node address %s", address)
            else:
                node.departed_at = None
        for address, node in list(self.nodes.items()):
            if address not in addresses and node.departed_at is None:
                node.departed_at = now
                node.mark_down("left discovery")
                log.info("node %s (%s) left discovery", node.node_id, address)
            if node.departed_at is not None and now - node.departed_at > self.config.node_gone_seconds * 4:
                del self.nodes[address]  # long gone: its id answers 410 as an unknown one
                await node.client.aclose()
                node.upstream.close()
        await asyncio.gather(*(self._ask(n) for n in self.nodes.values() if n.departed_at is None))
        self._index()
        self.refreshed.set()

    async def _ask(self, node: Node) -> None:
        if not node.bearer.proven and not await self._prove(node):
            return
        try:
            r = await node.client.get("/v1/info", timeout=self.config.node_timeout_seconds)
        except httpx.HTTPError as exc:
            if node.up:
                log.warning("node %s (%s) is not answering: %s", node.node_id, node.address, exc)
            node.mark_down(f"not answering ({type(exc).__name__})")
            return
        if r.status_code == 401:
            node.mark_down("refuses the gateway's node token")
            return
        try:
            info = r.json() if r.status_code == 200 else None
        except ValueError:
            info = None
        if not isinstance(info, dict):
            node.mark_down(f"/v1/info answered HTTP {r.status_code}")
            return
        if not info.get("node_id"):
            log.warning("node at %s has no node id (serve --node-id): not used", node.address)
        if info.get("node_id") != self.claims.holder_of(node.address):
            node.mark_down(f"its /v1/info names node {info.get('node_id')!r}, not the one it proved")
            return
        if not node.up:
            log.info("node %s (%s) is up", info.get("node_id"), node.address)
        node.mark_up(info)

    async def _prove(self, node: Node) -> bool:
        """The address proves it is a node and holds its id alone; else it is down, with why."""
        node_id, why = await identity.prove(node.client, node.target.peer, self.config.node_token,
                                            self.config.node_timeout_seconds)
        why = why or self.claims.claim(node_id, node.address, self._answers)
        if why:
            if node.error != why:
                log.warning("node address %s: %s", node.address, why)
            node.mark_down(why)
            return False
        node.bearer.proven = True
        return True

    def _answers(self, address: str) -> bool:
        """Whether the holder of an id is still there: proven since it was last down."""
        node = self.nodes.get(address)
        return node is not None and node.bearer.proven and node.departed_at is None

    def _index(self) -> None:
        by_id: dict[str, Node] = {}
        # Departed and down nodes first, so that a node id seen at a new address (a pod
        # that came back with another IP) routes there.
        order = sorted(self.nodes.values(), key=lambda n: (n.departed_at is None, n.up))
        for node in order:
            if node.node_id and self.claims.holder.get(node.node_id) == node.address:
                by_id[node.node_id] = node
        self.by_id = by_id

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_seconds)
            try:
                await self.refresh()
            except Exception:
                log.exception("node refresh failed")

    async def close(self) -> None:
        await asyncio.gather(*(n.client.aclose() for n in self.nodes.values()),
                             return_exceptions=True)
        for node in self.nodes.values():
            node.upstream.close()

    async def ask_again(self, nodes: list[Node]) -> None:
        """Ask these nodes for their info now, between two refreshes: placement found none
        fit by what they last said, which may predate sandboxes ended since."""
        await asyncio.gather(*(self._ask(n) for n in nodes))

    # ----------------------------------------------------------------- queries
    def usable(self) -> list[Node]:
        """Nodes that answer and have an id: the ones placement may choose from."""
        return [n for n in self.nodes.values() if n.up and n.node_id and n.departed_at is None]

    def known(self) -> list[Node]:
        return sorted(self.nodes.values(), key=lambda n: (n.node_id or "", n.address))

    def route(self, sandbox_id: str) -> Node:
        """The node that holds ``sandbox_id``, or the error that says why there is none."""
        node_id = node_of(sandbox_id)
        if node_id is None:
            raise ApiError(404, "not_found", f"no sandbox with id {sandbox_id!r}")
        node = self.by_id.get(node_id)
        if node is not None and node.up and node.departed_at is None:
            return node
        raise self.unreachable(sandbox_id, node_id, node)

    def unreachable(self, sandbox_id: str, node_id: str, node: Node | None) -> ApiError:
        now = time.monotonic()
        grace = self.config.node_gone_seconds
        if node is None:
            unknown = [n.address for n in self.nodes.values() if n.node_id is None and n.departed_at is None]
            if unknown and now - self.started < grace:
                return ApiError(503, "unavailable", f"sandbox {sandbox_id}: its node {node_id} is not known yet "
                                f"(nodes not answering: {', '.join(unknown)})", extra={"reason": NODE_UNAVAILABLE})
            known = ", ".join(sorted(self.by_id)) or "none"
            return ApiError(410, "gone", f"sandbox {sandbox_id}: the node {node_id} is gone "
                            f"(it is not among the nodes found: {known})",
                            extra={"state": V.LOST, "reason": NODE_GONE})
        since = node.departed_at if node.departed_at is not None else node.down_since
        waited = now - since if since is not None else 0.0
        if waited >= grace:
            return ApiError(410, "gone", f"sandbox {sandbox_id}: the node {node_id} is gone ({node.error or 'down'} "
                            f"for {waited:.0f} s)", extra={"state": V.LOST, "reason": NODE_GONE})
        return ApiError(503, "unavailable", f"sandbox {sandbox_id}: its node {node_id} is {node.error or 'down'} "
                        f"(for {waited:.0f} s; it counts as gone after {grace:.0f} s)",
                        extra={"reason": NODE_UNAVAILABLE})

    def lost(self, node: Node, now: float | None = None) -> bool:
        """The node has failed its checks for a whole timeout more: calls in flight on it
        end, rather than wait for a TCP timeout (a host that vanished sends no reset). One
        slow /v1/info alone does not end them."""
        now = time.monotonic() if now is None else now
        return (not node.up and node.down_since is not None
                and now - node.down_since >= self.config.node_timeout_seconds)

    def silent(self, node: Node, sandbox_id: str | None) -> ApiError:
        """The answer to a call that was waiting on ``node`` when it was found lost."""
        if sandbox_id:
            return self.unreachable(sandbox_id, node.node_id or "?", node)
        return ApiError(503, "unavailable", f"the node {node.node_id} stopped answering", extra={"reason": NODE_UNAVAILABLE})

    def not_reached(self, node: Node, sandbox_id: str | None, exc: BaseException) -> ApiError:
        """No connection to ``node`` could be made: the request never reached it (safe to
        try another node). The node counts as down from now."""
        node.mark_down(f"not answering ({type(exc).__name__})")
        if sandbox_id is None:
            return ApiError(503, "unavailable", f"the node {node.node_id} is not answering", extra={"reason": NODE_UNAVAILABLE})
        return self.unreachable(sandbox_id, node.node_id or "?", node)


def no_answer(node: Node, exc: BaseException) -> ApiError:
    """A call that may have reached ``node`` got no answer: a 503 that says so (never retried)."""
    return ApiError(503, "unavailable", f"the node {node.node_id} did not answer ({type(exc).__name__}: {exc})",
                    extra={"reason": NODE_UNAVAILABLE})
