"""The gateway's routes: the node server's /v1 API, served over many nodes.

Same token rule as a node, and user tokens besides (``callers.GatewayAuth``), same JSON
errors (``api.EXCEPTION_HANDLERS``), same request validation (``schemas``), the same OpenAPI
document plus the gateway's node routes.
Calls on one sandbox never reach this app: the gateway's relay (``relay.py``), which owns
the front port, passes them to their node as bytes and forwards every other request here,
over a unix socket of its own.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from functools import lru_cache

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..service import schemas
from ..service.api import EXCEPTION_HANDLERS, openapi_document, read_body
from ..usage.metrics import CONTENT_TYPE as METRICS_TYPE
from ..common.errors import ApiError
from ..service.openapi import error_responses, json_body, op
from . import callers, identity, placement, users
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .nodes import NODE_UNAVAILABLE, Node, NodeTable
from .proxy import NotSent, Proxy

log = logging.getLogger("sandbox.gateway")
DEFAULT_IMAGE = "default"
PULL_TIMEOUT = 600.0  # a node pulling an image before a create: a large image from a far registry


def table_of(request: Request) -> NodeTable:
    return request.app.state.table


async def health(request: Request):
    return JSONResponse({"status": "ok", "version": __version__, "role": "gateway"})


async def info(request: Request):
    table = table_of(request)
    nodes = [n.summary() for n in table.known()]
    pool: dict[str, dict] = {}
    for node in table.usable():
        for image, p in (node.info.get("pool") or {}).items():
            merged = pool.setdefault(image, {"ready": 0, "target": 0})
            merged["ready"] += p.get("ready", 0)
            merged["target"] += p.get("target", 0)
    return JSONResponse({"version": __version__, "role": "gateway", "discovery": table.source.describe(),
                         "sandboxes": sum(n.info.get("sandboxes") or 0 for n in table.usable()),
                         "pool": pool, "nodes": nodes})


async def openapi(request: Request):
    return JSONResponse(gateway_openapi())


async def metrics(request: Request):
    return Response(request.app.state.metrics.exposition(), media_type=METRICS_TYPE)


async def nodes(request: Request):
    return JSONResponse({"nodes": [n.summary() for n in table_of(request).known()]})


async def drain(request: Request):
    table, proxy, config = table_of(request), request.app.state.proxy, request.app.state.config
    node_id = request.path_params["node_id"]
    node = table.by_id.get(node_id)
    if node is None:
        raise ApiError(404, "not_found", f"no node {node_id!r} (known: {', '.join(sorted(table.by_id)) or 'none'})")
    if not node.up:
        raise ApiError(503, "unavailable", f"the node {node_id} is {node.error or 'down'}", extra={"reason": NODE_UNAVAILABLE})
    raw = await read_body(request, config.request_max_bytes)
    schemas.parse(raw, schemas.DRAIN)
    upstream = await proxy.send(node, "POST", "/v1/node/drain", content=raw, headers={"content-type": "application/json"})
    content = await _read_all(upstream, node)
    if upstream.status_code == 200:
        node.info["draining"] = json.loads(content).get("draining")
    return Response(content, upstream.status_code, media_type="application/json")


def scope_header(request: Request) -> dict[str, str]:
    """The Sandbox-Scope the node labels and filters by (sandbox/service/scopes.py): the
    caller's own, or a user token's user's (callers.py)."""
    return callers.forwarded_scope(request)


async def create(request: Request):
    table, proxy = table_of(request), request.app.state.proxy
    raw = await read_body(request, request.app.state.config.request_max_bytes)
    data = schemas.parse(raw, schemas.CREATE)
    image = data.get("image") or DEFAULT_IMAGE
    digest = placement.published(table.usable(), image)
    candidates, refused = placement.rank(table.usable(), image, data.get("memory_mb"), pullable=digest is not None)
    if not candidates and refused:
        # Every node looked unfit in its last info, which may be older than the sandboxes
        # deleted since (through another gateway, or on the node itself): ask once more.
        await table.ask_again(table.usable())
        candidates, refused = placement.rank(table.usable(), image, data.get("memory_mb"), pullable=digest is not None)
    for node in table.known():
        if node.node_id and not node.up and node.departed_at is None:
            refused[node.node_id] = node.error or "down"
        elif not node.node_id and (node.up or node.error == identity.NO_NODE_ID):  # the misconfiguration seen most
            refused[node.address] = identity.NO_NODE_ID
    for node in candidates:
        if digest is not None and placement.lacks(node.info, image):
            why = await pull_first(node, image, digest)
            if why:
                refused[node.node_id] = why
                continue
        try:
            upstream = await proxy.send(node, "POST", "/v1/sandboxes", content=raw,
                                        headers={"content-type": "application/json", **scope_header(request)})
        except NotSent as exc:
            refused[node.node_id] = exc.message
            continue
        content = await _read_all(upstream, node)
        # 503: draining, shutting down, or the sandbox could not start; 409: no room after
        # all (the info was stale): the next node.
        if upstream.status_code in (409, 503):
            refused[node.node_id] = _message(content)
            continue
        if upstream.status_code == 201:
            placement.note_placed(node.info, image, bool(json.loads(content).get("from_pool")), data.get("memory_mb"))
        return Response(content, upstream.status_code, media_type="application/json")
    why = "; ".join(f"{k}: {v}" for k, v in sorted(refused.items())) or _no_nodes(request.app.state.config)
    raise ApiError(503, "unavailable", f"no node can take a new sandbox now ({why})")


async def pull_first(node: Node, image: str, digest: str) -> str | None:
    """Have a node that lacks ``image`` pull it from its registry, exactly ``digest`` (the one
    another node published), before a sandbox is placed there; None, or why it did not."""
    try:
        r = await node.client.post(f"/v1/images/{image}/pull", json={"digest": digest}, timeout=PULL_TIMEOUT)
    except httpx.HTTPError as exc:
        return f"pulling image {image!r} failed ({type(exc).__name__})"
    if r.status_code != 200:
        return f"pulling image {image!r} ({digest}) failed: {_message(r.content)}"
    pool = node.info.setdefault("pool", {})
    if isinstance(pool, dict):
        pool.setdefault(image, {"ready": 0})
    return None


def _no_nodes(config) -> str:
    """Why the gateway knows no node at all, in terms of its own configuration."""
    if getattr(config, "dns_name", None):
        return (f"the DNS name {config.dns_name} has no A/AAAA records (is the headless Service there, and are "
                "its node pods ready?)")
    return "no node answered at the --node URLs given; each must run `sandbox-kernel serve --node-id NAME`"


async def from_every_node(request: Request, path: str, key: str) -> tuple[list[tuple[Node, list]], list[dict]]:
    """GET ``path`` on every known node at once: each answering node's ``key`` list, and the
    nodes that did not answer (with why)."""
    proxy, config = request.app.state.proxy, request.app.state.config
    list_timeout = httpx.Timeout(10.0, connect=config.node_timeout_seconds)
    known = [n for n in table_of(request).known() if n.node_id or n.up]

    async def one(node: Node) -> list:
        if not node.up:
            raise ApiError(503, "unavailable", node.error or "down")
        upstream = await proxy.send(node, "GET", path, timeout=list_timeout, headers=scope_header(request))
        content = await _read_all(upstream, node)
        if upstream.status_code != 200:
            raise ApiError(503, "unavailable", f"HTTP {upstream.status_code}: {_message(content)}")
        return json.loads(content)[key]

    results = await asyncio.gather(*(one(n) for n in known), return_exceptions=True)
    answers, unavailable = [], []
    for node, result in zip(known, results):
        if isinstance(result, BaseException):
            message = result.message if isinstance(result, ApiError) else f"{type(result).__name__}: {result}"
            unavailable.append({"node_id": node.node_id, "address": node.address, "message": message})
        else:
            answers.append((node, result))
    return answers, unavailable


async def list_sandboxes(request: Request):
    answers, unavailable = await from_every_node(request, "/v1/sandboxes", "sandboxes")
    return JSONResponse({"sandboxes": [with_owner(s) for _, found in answers for s in found],
                         "nodes_unavailable": unavailable})


def with_owner(view: dict) -> dict:
    """A sandbox a user token made, with its user as the owner (what ``ls`` shows the
    administrator); others as their node described them."""
    user = users.owner_of_label(view.get("scope"))
    return {**view, "owner": {"uid": None, "name": user}} if user is not None and "owner" not in view else view


async def usage_records(request: Request):
    """Every node's usage records, each with its node's id: the report sums them."""
    query = request.url.query
    answers, unavailable = await from_every_node(request, "/v1/usage" + (f"?{query}" if query else ""), "records")
    records = [{**r, "node": node.node_id} for node, found in answers for r in found]
    return JSONResponse({"records": records, "nodes_unavailable": unavailable})


async def any_node(request: Request):
    """The images: every node builds the same ones, so any node's list answers."""
    usable = sorted(table_of(request).usable(), key=lambda n: n.node_id)
    if not usable:
        raise ApiError(503, "unavailable", "no node is answering")
    node = usable[0]
    upstream = await request.app.state.proxy.send(node, "GET", request.url.path)
    content = await _read_all(upstream, node)
    return Response(content, upstream.status_code, media_type="application/json")


async def image_build_elsewhere(request: Request):
    raise ApiError(501, "not_supported", "images are built on each node (sandbox-kernel image build; in Kubernetes "
                   "the node DaemonSet's init step), not through the gateway")


ROUTES = [
    Route("/v1/health", health, methods=["GET"]),
    Route("/v1/info", info, methods=["GET"]),
    Route("/v1/openapi.json", openapi, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/v1/nodes", nodes, methods=["GET"]),
    Route("/v1/nodes/{node_id}/drain", drain, methods=["POST"]),
    Route("/v1/sandboxes", create, methods=["POST"]),
    Route("/v1/sandboxes", list_sandboxes, methods=["GET"]),
    Route("/v1/usage", usage_records, methods=["GET"]),
    Route("/v1/images", any_node, methods=["GET"]),
    Route("/v1/images", image_build_elsewhere, methods=["POST"]),
    Route("/v1/images/{name}", any_node, methods=["GET"]),
    Route("/v1/images/{name}", image_build_elsewhere, methods=["DELETE"]),
]


def build_gateway_app(config: GatewayConfig, table: NodeTable) -> Starlette:
    """The app behind the relay; the node table's refresh is run by ``server.py``, which
    shares the table with the relay."""
    app = Starlette(routes=ROUTES, exception_handlers=EXCEPTION_HANDLERS)
    app.add_middleware(callers.GatewayAuth, token=config.token, user_secret=config.user_secret)
    app.state.table = table
    app.state.proxy = Proxy(table)
    app.state.config = config
    app.state.metrics = GatewayMetrics(table)
    return app


async def _read_all(upstream: httpx.Response, node: Node) -> bytes:
    try:
        return await upstream.aread()
    except httpx.TransportError as exc:
        raise ApiError(503, "unavailable", f"the node {node.node_id} broke off its answer ({type(exc).__name__})",
                       extra={"reason": NODE_UNAVAILABLE}) from None
    finally:
        await upstream.aclose()


def _message(content: bytes) -> str:
    try:
        return json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return content[:200].decode("utf-8", "replace")


@lru_cache(maxsize=1)
def gateway_openapi() -> dict:
    """The node server's document, with the node's own routes (drain, proof) swapped for the
    gateway's node routes."""
    doc = copy.deepcopy(openapi_document())
    doc["paths"].pop("/v1/node/drain", None)
    doc["paths"].pop("/v1/node/proof", None)  # a node's own: the gateway asks it, never serves it
    node_id = {"name": "node_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 40}}
    doc["paths"]["/v1/nodes"] = {"get": op("The nodes behind this gateway: address, state, capacity, pool", errors=(401,))}
    doc["paths"]["/v1/nodes/{node_id}/drain"] = {"post": op(
        "Drain a node (no new sandboxes; existing ones run out), or undo it", params=[node_id],
        body=json_body(schemas.DRAIN), errors=(400, 401, 404, 413, 422, 503))}
    for method in ("post",):
        doc["paths"]["/v1/images"][method]["responses"].update(error_responses(501))
    doc["paths"]["/v1/images/{name}"]["delete"]["responses"].update(error_responses(501))
    doc["info"]["description"] += " Served by a gateway over many nodes."
    return doc
