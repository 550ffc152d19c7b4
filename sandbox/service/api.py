"""HTTP routes: the thin layer that turns requests into manager calls and errors into JSON.

Every failure leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status, whether it
came from validation, the manager, Starlette's routing or an unexpected bug (logged, and
answered with a 500 that leaks nothing). Who the caller is (peer uid on the unix socket,
bearer token on TCP) is sandbox/service/auth.py's job; on a shared server a tenant's request for
another user's sandbox is answered exactly as for an unknown id (404), so ids do not leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import urllib.parse
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from . import commands, nodeproof, schemas, scopes
from ..core import descriptors
from ..images import image_packages
from .auth import Auth, caller_of
from ..common.errors import ApiError
from ..core import saves
from ..core.files import Workspace
from ..core.filework import FileWork
from ..core.handles import Handle
from ..images.images import ImageError
from ..isolation import host
from ..core.manager import SandboxManager
from ..runtime import vocabulary as V
from ..usage import report, store as usage_store
from ..usage.metrics import CONTENT_TYPE as METRICS_TYPE, ServerMetrics
from .ndjson import MEDIA_TYPE as NDJSON, NdjsonResponse
from .openapi import (COMMAND_ID, FILE_LIST, FILE_PATH, IMAGE_NAME, INFO, LABEL, SANDBOX_ID, SANDBOX_REF,
                      SANDBOX_SCOPE, SAVE_ID, SECRET_NAME, SECRET_VIEW, USAGE_RECORDS, USAGE_SANDBOX, USAGE_SINCE, document, json_body, op)

log = logging.getLogger("sandbox.service.api")


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


# The gateway's name for it (sandbox/gateway/app.py): on TCP, Auth is the bearer-token check.
TokenAuth = Auth


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "too_large", f"the request body is larger than the {limit} byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "too_large", f"the request body is larger than the {limit} byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def file_path(request: Request) -> str:
    """The ``{path}`` of a files route, in the escaped spelling of sandbox/common/filenames.py.

    The server decodes a URL's percent escapes as UTF-8 and would turn a byte that is not
    UTF-8 into U+FFFD, naming some other file: such a URL is refused, pointing at the
    escaped spelling (``%FF`` in a URL is ``\\xff`` in the path)."""
    raw = request.scope.get("raw_path")
    if raw is not None:
        try:
            urllib.parse.unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "invalid_path", "the URL's path is not UTF-8 once percent-decoded: spell a byte that is "
                           "not UTF-8 as \\xHH (a backslash, x, two hex digits; a backslash itself as \\\\), "
                           "as GET /files lists it") from None
    return request.path_params["path"]


def manager_of(request: Request) -> SandboxManager:
    return request.app.state.manager


async def body(request: Request, fields) -> dict:
    return schemas.parse(await read_body(request, manager_of(request).config.request_max_bytes), fields)


def may_reach(request: Request, sandbox_id: str) -> bool:
    """Whether the caller may see the sandbox: its tenant (on a shared server) and its
    declared scope (sandbox/service/scopes.py) both allow it."""
    manager = manager_of(request)
    return (caller_of(request).may_see(manager.owner_of(sandbox_id))
            and scopes.of_request(request).may_reach(manager.tenancy.scope_of(sandbox_id)))


def reachable(request: Request) -> list[Handle]:
    """The live sandboxes the caller may see."""
    return [h for h in manager_of(request).list() if may_reach(request, h.id)]


def visible(request: Request) -> Handle:
    """The sandbox the path names, as it is (a paused one stays paused), if the caller may
    see it (else 404, as for an unknown id)."""
    manager = manager_of(request)
    sandbox_id = request.path_params["sandbox_id"]
    if not may_reach(request, sandbox_id):
        raise manager.not_found(sandbox_id)
    return manager.get(sandbox_id)


def described(request: Request, view: dict) -> dict:
    """A sandbox's description with its scope label (None: made by an unscoped caller), and
    on a shared (--multi-user) server its owner: root lists every user's sandboxes there and
    must be able to tell whose each is."""
    manager = manager_of(request)
    view = {**view, "scope": manager.tenancy.scope_of(view["id"])}
    if request.app.state.multi_user:
        view["owner"] = owner_view(manager.owner_of(view["id"]))
    return view


def owner_view(uid: int | None) -> dict:
    """An owner as the API shows it: the uid (None: the server's own user's) and its name."""
    return {"uid": os.getuid() if uid is None else uid, "name": usage_store.owner_name(uid)}


def labelled(request: Request, view: dict) -> dict:
    """Label a sandbox the caller just made with the caller's own scope, if it declared one."""
    own = scopes.of_request(request).own
    if own is not None:
        manager = manager_of(request)
        manager.tenancy.label(view["id"], manager.state_dir.sandbox(view["id"]), own)
    return described(request, view)


async def live(request: Request) -> Handle:
    """The sandbox the path names, running: a paused one is restored first."""
    handle = visible(request)
    await manager_of(request).wake(handle)
    return handle


def admin_only(request: Request, what: str) -> None:
    caller = caller_of(request)
    if caller.tenant is not None:
        raise ApiError(403, "forbidden", f"{what} is for the server's administrator on a shared server "
                                         f"(you are {caller.label})")


def ndjson(events, first: dict | None = None) -> NdjsonResponse:
    """A stream of events, one JSON object a line, flushed as each comes (``first`` before them)."""
    return NdjsonResponse(events, first)


# ---------------------------------------------------------------------- the node
async def health(request: Request):
    return JSONResponse({"status": "ok", "version": __version__})


async def info(request: Request):
    manager, caller = manager_of(request), caller_of(request)
    return JSONResponse({"version": __version__, "state_dir": manager.state_dir.root,
                         "protections": manager.protections, "pool": manager.pool_status(),
                         "image_digests": manager.image_digests(),
                         "sandboxes": len(reachable(request)),
                         "node_id": manager.config.node_id or None, "draining": manager.draining,
                         "multi_user": request.app.state.multi_user, "caller": caller.label,
                         **manager.capacity_report()})


async def node_proof(request: Request):
    """Open (no token): a gateway asks it before it sends the token here (sandbox/service/nodeproof.py)."""
    node_id, challenge = manager_of(request).config.node_id, request.query_params.get("challenge", "")
    server = request.scope.get("server")
    if not node_id:
        raise ApiError(404, "no_node_id", "this server has no node id (serve --node-id)")
    if not server or server[1] is None:
        raise ApiError(404, "not_found", "this server is not reached over TCP")
    if not nodeproof.CHALLENGE.fullmatch(challenge):
        raise ApiError(422, "invalid_request", "'challenge' must be 32 to 128 lowercase hex digits")
    address = nodeproof.address_text(*server)
    return JSONResponse({"node_id": node_id, "address": address,
                         "proof": nodeproof.proof(request.app.state.node_token, challenge, node_id, address)})


async def drain(request: Request):
    admin_only(request, "draining the node")
    manager = manager_of(request)
    data = await body(request, schemas.DRAIN)
    manager.draining = data.get("draining", True)
    return JSONResponse({"node_id": manager.config.node_id or None, "draining": manager.draining,
                         "sandboxes": len(manager.list())})


async def openapi(request: Request):
    return JSONResponse(openapi_document())


async def metrics(request: Request):
    """Prometheus' text format. A tenant of a shared server may not read it (it counts
    everyone's sandboxes); the loopback scrape port (metrics_port) is open (sandbox/service/auth.py)."""
    if caller_of(request).tenant is not None:
        admin_only(request, "reading the metrics")
    return Response(await asyncio.to_thread(request.app.state.metrics.exposition), media_type=METRICS_TYPE)


# ------------------------------------------------------------------- sandboxes
async def create(request: Request):
    data = await body(request, schemas.CREATE)
    caller = caller_of(request)
    scopes.of_request(request)  # a malformed scope is refused before anything is made
    if data.get("end_with_caller") and caller.peer is None:
        raise ApiError(422, "invalid_request", "end_with_caller needs the server's unix socket, where the server "
                                               "knows the calling process; over TCP it cannot")
    created = await manager_of(request).create(data, owner=caller.tenant, caller=caller.peer)
    request.app.state.metrics.created(created)
    return JSONResponse(labelled(request, created), status_code=201)


async def usage_records(request: Request):
    """The usage records of this server's sandboxes (a tenant's own only), those still alive
    or ended at or after ``since``."""
    manager, caller = manager_of(request), caller_of(request)
    try:
        since = report.parse_since(request.query_params.get("since"))
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    records = await asyncio.to_thread(manager.usage_store.records, since, request.query_params.get("sandbox_id"))
    if caller.tenant is not None:
        mine = usage_store.owner_name(caller.tenant)
        records = [r for r in records if r["owner"] == mine]
    return JSONResponse({"records": records})


async def put_secret(request: Request):
    data = await body(request, schemas.SECRET)
    secret = manager_of(request).egress.secrets.put(request.path_params["name"], data["value"], data["hosts"],
                                                    owner=caller_of(request).tenant)
    return JSONResponse(secret.describe())


async def list_secrets(request: Request):
    return JSONResponse({"secrets": manager_of(request).egress.secrets.list(caller_of(request).tenant)})


async def delete_secret(request: Request):
    manager_of(request).egress.secrets.delete(request.path_params["name"], caller_of(request).tenant)
    return JSONResponse({"name": request.path_params["name"], "deleted": True})


async def list_sandboxes(request: Request):
    manager = manager_of(request)
    return JSONResponse({"sandboxes": [described(request, manager.describe(h)) for h in reachable(request)]})


async def get_sandbox(request: Request):
    return JSONResponse(described(request, await manager_of(request).refresh(visible(request))))


async def delete_sandbox(request: Request):
    visible(request)
    return JSONResponse(await manager_of(request).delete(request.path_params["sandbox_id"]))


async def renew(request: Request):
    manager, handle = manager_of(request), await live(request)
    data = await body(request, schemas.RENEW)
    most = manager.config.max_ttl_seconds
    for key in ("ttl_seconds", "extend_seconds"):  # an extension is a TTL, once
        if data.get(key, 0) > most:
            raise ApiError(422, "limit_exceeded", f"{key} {data[key]} is more than a sandbox may have here "
                           f"(at most {most}, max_ttl_seconds)",
                           extra={"exceeded": {key: {"requested": data[key], "allowed": most,
                                                     "set_by": "max_ttl_seconds"}}})
    await manager.call(handle, {"op": "renew", **data})
    return JSONResponse(described(request, manager.describe(handle)))


async def pause(request: Request):
    handle = visible(request)
    with request.app.state.metrics.timing("pause"):
        return JSONResponse(described(request, await manager_of(request).pause(handle)))


async def resume(request: Request):
    manager, handle = manager_of(request), visible(request)
    with request.app.state.metrics.timing("resume"):
        woke = await manager.wake(handle)
    view = manager.describe(handle)
    if woke:  # what the wake said (for a sleep by value: what came back and what did not)
        view["wake_note"] = woke
    return JSONResponse(described(request, view))


async def fork(request: Request):
    manager, handle = manager_of(request), visible(request)
    data = await body(request, schemas.FORK)
    with request.app.state.metrics.timing("fork"):
        forked = await manager.fork(handle, data, owner=caller_of(request).tenant)
    request.app.state.metrics.created(forked)
    return JSONResponse(labelled(request, forked), status_code=201)


# ----------------------------------------------------------- state by value
async def save_sandbox(request: Request):
    manager, handle = manager_of(request), await live(request)
    data = await body(request, schemas.SAVE)
    saved = await manager.saving.save(handle, caller_of(request).tenant, data.get("label"))
    return JSONResponse(saved, status_code=201)


async def restore_sandbox(request: Request):
    manager, handle = manager_of(request), await live(request)
    data = await body(request, schemas.RESTORE)
    return JSONResponse(await manager.saving.restore(handle, caller_of(request).tenant, data["save_id"]))


async def list_saves(request: Request):
    store = manager_of(request).saves
    owner, label = caller_of(request).tenant, request.query_params.get("label")
    found = await asyncio.to_thread(store.list, owner, label)
    # with a label: the last save the server could not make under it, since the last that it made
    return JSONResponse({"saves": [saves.public(r) for r in found], "last_failure": store.last_failure(owner, label)})


async def get_save(request: Request):
    return JSONResponse(saves.public(manager_of(request).saves.get(caller_of(request).tenant,
                                                                   request.path_params["save_id"])))


async def delete_save(request: Request):
    store = manager_of(request).saves
    return JSONResponse(await asyncio.to_thread(store.delete, caller_of(request).tenant, request.path_params["save_id"]))


async def hold(request: Request):
    """The calling process (a notebook's kernel) serves this sandbox now: refused with 409
    in_use while another live process does (two kernels never share a sandbox). The caller is
    known by its pid on the unix socket only."""
    manager, peer = manager_of(request), caller_of(request).peer
    handle = visible(request)
    if peer is None:
        raise ApiError(422, "invalid_request", "hold needs the server's unix socket, where the server knows the "
                                               "calling process")
    holder = manager.tenancy.hold(handle.id, peer.pid)
    if holder is not None:
        raise ApiError(409, "in_use", f"sandbox {handle.id} is in use by another live process (pid {holder}, "
                                      "a kernel): two kernels never share a sandbox; shut that kernel down first",
                       extra={"holder_pid": holder})
    return JSONResponse({"id": handle.id, "holder_pid": peer.pid})


async def interrupt(request: Request):
    reply = await manager_of(request).call(await live(request), {"op": "interrupt"})
    return JSONResponse({"interrupted": reply.get("interrupted", False)})


def forwarder(op: str, fields, keys):
    """A handler that passes a request to the sandbox's runtime and answers with ``keys`` of its reply."""
    async def handler(request: Request):
        handle = await live(request)
        data = await body(request, fields)
        reply = await manager_of(request).call(handle, {"op": op, **data})
        return JSONResponse({k: reply.get(k) for k in keys if k in reply})
    return handler


async def execute(request: Request):
    data = await body(request, schemas.EXECUTE)
    schemas.check_user_expressions(data)
    return await stream_execute(request, data, V.OP_EXECUTE)


async def comm(request: Request):
    """A comm message from the frontend: queued with executes and streamed like one."""
    return await stream_execute(request, await body(request, schemas.COMM), V.OP_COMM)


async def answer_input(request: Request):
    reply = await manager_of(request).call(await live(request), {"op": "input", **await body(request, schemas.INPUT)})
    return JSONResponse({"delivered": bool(reply.get("delivered"))})


async def stream_execute(request: Request, data: dict, op: str):
    manager, handle = manager_of(request), visible(request)
    restored = await manager.wake(handle)
    events = await manager.open_execute(handle, data, op)
    if op == V.OP_EXECUTE:
        events = request.app.state.metrics.timed_execute(events)
    # the first call after a pause waited for the restore: say so
    return ndjson(events, first=V.stream_event(V.STDERR, restored, note=True) if restored else None)


async def run_command(request: Request):
    manager, handle = manager_of(request), await live(request)
    # Room for the largest stdin as base64 on top of the usual body limit.
    raw = await read_body(request, manager.config.request_max_bytes + commands.MAX_STDIN_BASE64)
    data = commands.prepare(schemas.parse(raw, schemas.COMMAND))
    return ndjson(await manager.open_command(handle, data))


async def list_commands(request: Request):
    reply = await manager_of(request).call(await live(request), {"op": "commands"})
    return JSONResponse({"commands": reply.get("commands", [])})


async def interrupt_command(request: Request):
    reply = await manager_of(request).call(await live(request), {"op": "command_interrupt",
                                                           "command_id": request.path_params["command_id"]})
    return JSONResponse({"interrupted": reply.get("interrupted", False)})


# ----------------------------------------------------------------------- files
async def workspace(request: Request) -> Workspace:
    handle, config = await live(request), manager_of(request).config
    return Workspace(host.workspace_dir(handle.dir), handle.uid, config.file_max_bytes, config.file_delete_seconds)


def file_work(request: Request):
    """Run blocking file work for the sandbox the path names, within its share of the
    file-work threads (sandbox/core/filework.py)."""
    work: FileWork = request.app.state.file_work
    sandbox_id = request.path_params["sandbox_id"]
    return functools.partial(work.run, sandbox_id)


async def put_file(request: Request):
    ws = await workspace(request)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > ws.max_bytes:
        raise ApiError(413, "too_large", f"the file is larger than the {ws.max_bytes} byte limit for one file")
    result = await ws.write(file_path(request), request.stream())
    return JSONResponse(result, status_code=201)


async def get_file(request: Request):
    ws, run = await workspace(request), file_work(request)
    fd, size = await run(ws.open_for_read, file_path(request))
    return StreamingResponse(ws.read_chunks(fd, size, run), media_type="application/octet-stream",
                             headers={"Content-Length": str(size)})


async def list_files(request: Request):
    ws = await workspace(request)
    return JSONResponse(await file_work(request)(ws.list, manager_of(request).config.files_list_max))


async def delete_file(request: Request):
    ws = await workspace(request)
    return JSONResponse(await file_work(request)(ws.delete, file_path(request)))


# ---------------------------------------------------------------------- images
def image_view(info: dict, manager: SandboxManager) -> dict:
    return {k: info.get(k) for k in ("name", "base", "root", "apt", "npm", "pip", "preload", "packages", "built_at",
                                     "size_bytes", "python_version")} | {
        "in_use": manager.in_use(info["name"]), "pool": manager.pool_target(info["name"])}


async def list_images(request: Request):
    manager = manager_of(request)
    return JSONResponse({"images": [image_view(i, manager) for i in manager.images.list()]})


async def get_image(request: Request):
    manager = manager_of(request)
    found = manager.images.get(request.path_params["name"])
    if found is None:
        raise ApiError(404, "not_found", f"no image named {request.path_params['name']!r}")
    return JSONResponse(image_view(found, manager) | {"package_list": image_packages.package_list(found)})


async def build_image(request: Request):
    admin_only(request, "building an image")
    manager = manager_of(request)
    data = await body(request, schemas.IMAGE_BUILD)
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def progress(line: str) -> None:
        if "WARNING: Location" not in line:
            loop.call_soon_threadsafe(queue.put_nowait, {"type": "progress", "message": line})

    async def build() -> None:
        try:
            built = await manager.build_image(data["name"], pip=data.get("pip", []), requirements=data.get("requirements"),
                                              preload=data.get("preload"), apt=data.get("apt", []),
                                              npm=data.get("npm", []), root=data.get("root"),
                                              base=data.get("base"), progress=progress)
            result = {"type": "done", "status": "ok", "image": image_view(built, manager)}
        except ImageError as exc:
            result = {"type": "done", "status": "error", "error": {"code": exc.code, "message": str(exc)}}
        except Exception as exc:  # pip or the disk failed: say so, keep serving
            log.exception("image build failed")
            result = {"type": "done", "status": "error", "error": {"code": "build_failed", "message": str(exc)}}
        queue.put_nowait(result)

    async def events():
        task = asyncio.create_task(build())
        while True:
            event = await queue.get()
            yield json.dumps(event) + "\n"
            if event["type"] == "done":
                break
        await task

    return StreamingResponse(events(), media_type=NDJSON)


REGISTRY_STATUS = {"not_found": 404, "conflict": 409, "unavailable": 503, "registry_failed": 502,
                   "digest_mismatch": 502}


async def push_image(request: Request):
    """Push an image to the configured registry (``image_registry``): the digest to pull it by."""
    admin_only(request, "pushing an image")
    name = request.path_params["name"]
    try:
        digest = await manager_of(request).push_image(name)
    except ImageError as exc:
        raise ApiError(REGISTRY_STATUS.get(exc.code, 400), exc.code, str(exc)) from None
    return JSONResponse({"name": name, "digest": digest})


async def pull_image(request: Request):
    """Pull an image from the configured registry, every blob verified (by digest: exactly
    that one); a gateway has a node pull an image this way before it places a sandbox there."""
    admin_only(request, "pulling an image")
    manager, name = manager_of(request), request.path_params["name"]
    data = await body(request, schemas.IMAGE_PULL)
    try:
        info, digest = await manager.pull_image(name, data.get("digest"))
    except ImageError as exc:
        raise ApiError(REGISTRY_STATUS.get(exc.code, 400), exc.code, str(exc)) from None
    return JSONResponse({"name": name, "digest": digest, "image": image_view(info, manager)})


async def delete_image(request: Request):
    admin_only(request, "removing an image")
    name = request.path_params["name"]
    try:
        await manager_of(request).remove_image(name)
    except ImageError as exc:
        raise ApiError({"not_found": 404, "conflict": 409}.get(exc.code, 400), exc.code, str(exc)) from None
    return JSONResponse({"name": name, "deleted": True})


# ------------------------------------------------------------- the route table
@dataclass(frozen=True)
class Endpoint:
    """One route and its OpenAPI operation (None: served, but not in the document)."""

    method: str
    path: str
    handler: Callable
    operation: dict | None

    def route(self) -> Route:
        return Route(self.path, self.handler, methods=[self.method])


SID = "/v1/sandboxes/{sandbox_id}"
FILE = SID + "/files/{path:path}"
ON_SANDBOX = (400, 401, 404, 410, 413, 422)  # a request with a body, to one sandbox
ENDPOINTS = (
    Endpoint("GET", "/v1/health", health, op("Liveness (no token needed)", errors=())),
    Endpoint("GET", "/v1/info", info, op("Version, protections in force, warm pool, node id, draining, limits and "
                                         "free capacity", errors=(401,), ok_schema=INFO)),
    Endpoint("GET", "/v1/node/proof", node_proof, op(
        "This node's id, the address it was reached at and an HMAC of ?challenge= with the node token (no token "
        "needed: a gateway checks it before it sends the token)", errors=(404, 422))),
    Endpoint("POST", "/v1/node/drain", drain, op("Drain this node (no new sandboxes; existing ones run out), or undo it",
                                                 body=json_body(schemas.DRAIN), errors=(400, 401, 413, 422))),
    Endpoint("GET", "/v1/openapi.json", openapi, None),
    Endpoint("GET", "/metrics", metrics, op(
        "Prometheus metrics (text format 0.0.4): sandboxes by state and tier, creates, executes and their latency, "
        "the warm pool, egress, usage totals, pause/resume/fork times, the server's own memory and descriptors",
        content=METRICS_TYPE, errors=(401, 403), ok_schema={"type": "string"})),
    Endpoint("POST", "/v1/sandboxes", create, op(
        "Create (or claim from the warm pool) a sandbox; limits over the per-sandbox maxima get 422 "
        "limit_exceeded, past the server's totals 409 capacity_exceeded", ok="201", body=json_body(schemas.CREATE),
        params=[SANDBOX_SCOPE], errors=(400, 401, 404, 409, 413, 422, 503), ok_schema=SANDBOX_REF)),
    Endpoint("GET", "/v1/sandboxes", list_sandboxes, op("List live sandboxes (a scoped caller: its scopes' only)",
                                                        params=[SANDBOX_SCOPE], errors=(400, 401))),
    Endpoint("GET", SID, get_sandbox, op("Status of one sandbox", params=[SANDBOX_ID], ok_schema=SANDBOX_REF)),
    Endpoint("DELETE", SID, delete_sandbox, op("Delete a sandbox and kill all of its processes", params=[SANDBOX_ID])),
    Endpoint("POST", SID + "/renew", renew, op("Renew the TTL", params=[SANDBOX_ID], body=json_body(schemas.RENEW),
                                               errors=ON_SANDBOX)),
    Endpoint("POST", SID + "/save", save_sandbox, op(
        "Save the sandbox's namespace by value (inside it: cloudpickle, arrays and frames as raw buffers) into "
        "your store of saves; what cannot be saved (open files, sockets, threads, generators) is named in the "
        "summary. 409 save_refused, with nothing lost, past save_max_mb, your saves_max_mb or save_seconds",
        ok="201", params=[SANDBOX_ID], body=json_body(schemas.SAVE), errors=(400, 401, 404, 409, 410, 413, 422, 503))),
    Endpoint("POST", SID + "/restore", restore_sandbox, op(
        "Load a save into this sandbox's namespace (inside the sandbox; the server never unpickles a save): "
        "what came back, what did not, and the save's age", params=[SANDBOX_ID], body=json_body(schemas.RESTORE),
        errors=(400, 401, 404, 410, 413, 422, 503))),
    Endpoint("GET", "/v1/saves", list_saves, op("Your saves, newest first (?label= for one label's)", params=[LABEL],
                                                     errors=(401,))),
    Endpoint("GET", "/v1/saves/{save_id}", get_save, op("One save: its label, source, age, size and summary",
                                                        params=[SAVE_ID], errors=(401, 404))),
    Endpoint("DELETE", "/v1/saves/{save_id}", delete_save, op("Delete a save", params=[SAVE_ID], errors=(401, 404))),
    Endpoint("POST", SID + "/interrupt", interrupt, op("Interrupt the running cell", params=[SANDBOX_ID])),
    Endpoint("POST", SID + "/hold", hold, op(
        "The calling process (a notebook's kernel) serves this sandbox now, letting go of any other it held; "
        "409 in_use while another live process holds it. Unix socket only (the caller's pid): 422 over TCP",
        params=[SANDBOX_ID], errors=(401, 404, 409, 410, 422))),
    Endpoint("POST", SID + "/pause", pause, op(
        "Pause a gvisor sandbox: checkpoint its live interpreter to disk and free its memory; the next call "
        "restores it. 409 with a reason (not_supported, busy, not_running, checkpoint_failed) when it cannot",
        params=[SANDBOX_ID], errors=(401, 404, 409, 410), ok_schema=SANDBOX_REF)),
    Endpoint("POST", SID + "/resume", resume, op(
        "Restore a paused sandbox now (any other call does it too); 409 version_mismatch when its checkpoint "
        "was taken under another runsc or image", params=[SANDBOX_ID], errors=(401, 404, 409, 410, 503),
        ok_schema=SANDBOX_REF)),
    Endpoint("POST", SID + "/fork", fork, op(
        "Fork a gvisor sandbox: restore its checkpoint as a second, independent sandbox (a new id, a copy of "
        "its workspace, its limits; its TTL unless the body names one). A running source is paused for the "
        "checkpoint and restored once the fork runs, after the answer (a call to it waits for that); a paused "
        "one stays paused. The answer's timeline says where the time went. Counts against the server's "
        "limits like a create. 409 with a reason: not_supported (a bwrap sandbox), busy, not_running, "
        "checkpoint_failed, version_mismatch; 409 capacity_exceeded past the server's totals", ok="201", params=[SANDBOX_ID],
        body=json_body(schemas.FORK), errors=(400, 401, 404, 409, 410, 413, 422, 503), ok_schema=SANDBOX_REF)),
    Endpoint("POST", SID + "/execute", execute, op(
        "Run code; events stream as NDJSON", params=[SANDBOX_ID], body=json_body(schemas.EXECUTE), content=NDJSON,
        errors=ON_SANDBOX, ok_schema={"$ref": "#/components/schemas/ExecuteEvent"})),
    Endpoint("POST", SID + "/comm", comm, op(
        "Deliver a comm message from the frontend (ipywidgets: a slider moved) to the sandbox's IPython; "
        "queued behind running executes and run like one: the output and comm messages of its handlers "
        "stream as NDJSON, ending with done", params=[SANDBOX_ID], body=json_body(schemas.COMM), content=NDJSON,
        errors=ON_SANDBOX, ok_schema={"$ref": "#/components/schemas/ExecuteEvent"})),
    Endpoint("POST", SID + "/input", answer_input, op(
        "Answer the running execute's input_request (input(), getpass()); delivered is false when no cell "
        "is waiting for input", params=[SANDBOX_ID], body=json_body(schemas.INPUT), errors=ON_SANDBOX,
        ok_schema={"type": "object", "properties": {"delivered": {"type": "boolean"}}})),
    Endpoint("POST", SID + "/commands", run_command, op(
        "Run a program (argv or a shell line) beside the interpreter; start, stdout/stderr "
        "and done (exit_code, timed_out, duration) stream as NDJSON", params=[SANDBOX_ID],
        body=json_body(schemas.COMMAND), content=NDJSON, errors=(400, 401, 404, 409, 410, 413, 422, 429, 503))),
    Endpoint("GET", SID + "/commands", list_commands, op("Commands running now", params=[SANDBOX_ID])),
    Endpoint("POST", SID + "/commands/{command_id}/interrupt", interrupt_command, op(
        "Interrupt a running command (SIGINT to its process group, SIGKILL after 2 s)", params=[SANDBOX_ID, COMMAND_ID])),
    Endpoint("POST", SID + "/complete", forwarder("complete", schemas.COMPLETE, ("matches", "cursor_start", "cursor_end", "metadata")),
             op("Completions at a cursor", params=[SANDBOX_ID], body=json_body(schemas.COMPLETE), errors=ON_SANDBOX)),
    Endpoint("POST", SID + "/inspect", forwarder("inspect", schemas.INSPECT, ("found", "data", "metadata")),
             op("Object inspection at a cursor", params=[SANDBOX_ID], body=json_body(schemas.INSPECT), errors=ON_SANDBOX)),
    Endpoint("POST", SID + "/is_complete", forwarder("is_complete", schemas.IS_COMPLETE, ("status", "indent")),
             op("Whether code is a complete statement", params=[SANDBOX_ID], body=json_body(schemas.IS_COMPLETE),
                errors=ON_SANDBOX)),
    Endpoint("GET", SID + "/files", list_files, op("List /workspace (recursive, capped at files_list_max entries)",
                                                   params=[SANDBOX_ID], ok_schema=FILE_LIST)),
    Endpoint("PUT", FILE, put_file, op(
        "Upload a file (streamed raw body)", ok="201", params=[SANDBOX_ID, FILE_PATH],
        body={"required": False, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        errors=(400, 401, 404, 410, 413, 507))),
    Endpoint("GET", FILE, get_file, op("Download a file (streamed; refused past file_max_bytes of apparent size)",
                                       params=[SANDBOX_ID, FILE_PATH], content="application/octet-stream",
                                       errors=(400, 401, 404, 410, 413))),
    Endpoint("DELETE", FILE, delete_file, op("Delete a file or directory", params=[SANDBOX_ID, FILE_PATH],
                                             errors=(400, 401, 404, 409, 410))),
    Endpoint("GET", "/v1/usage", usage_records, op(
        "Usage records (one per sandbox: owner, image, tier, limits, created, ended and why, CPU-s, peak memory, "
        "memory and disk GiB-hours, egress bytes, executes, commands), of sandboxes alive or ended at or after "
        "`since`; a tenant of a shared server sees their own", params=[USAGE_SINCE, USAGE_SANDBOX], errors=(401, 422),
        ok_schema=USAGE_RECORDS)),
    Endpoint("GET", "/v1/secrets", list_secrets, op(
        "List your registered secrets (names and hosts; never a value)", errors=(401,),
        ok_schema={"type": "object", "properties": {"secrets": {"type": "array", "items": SECRET_VIEW}}})),
    Endpoint("PUT", "/v1/secrets/{name}", put_secret, op(
        "Register or replace a secret bound to hosts; sandboxes that name it in egress.secrets see a "
        "placeholder, which the egress proxy replaces in request headers to those hosts only, over TLS only "
        "(capped per user: 409/422 limit_exceeded)",
        params=[SECRET_NAME], body={"required": True, "content": {"application/json": {
            "schema": schemas.object_schema(schemas.SECRET)}}},
        errors=(400, 401, 409, 413, 422), ok_schema=SECRET_VIEW)),
    Endpoint("DELETE", "/v1/secrets/{name}", delete_secret, op(
        "Forget a secret (sandboxes holding its placeholder no longer get the value)",
        params=[SECRET_NAME], errors=(401, 404))),
    Endpoint("GET", "/v1/images", list_images, op("List images", errors=(401,))),
    Endpoint("POST", "/v1/images", build_image, op("Build an image (progress streams as NDJSON)",
                                                   body=json_body(schemas.IMAGE_BUILD), content=NDJSON,
                                                   errors=(400, 401, 403, 413, 422))),
    Endpoint("GET", "/v1/images/{name}", get_image, op(
        "One image, with package_list: each package's name, version, layer (the image or its base), source "
        "(the package index, or the URL it was installed from), requested (by the recipe) and installer",
        params=[IMAGE_NAME], errors=(401, 404))),
    Endpoint("POST", "/v1/images/{name}/push", push_image, op(
        "Push an image to the node's image registry (image_registry) as an OCI image: its manifest digest",
        params=[IMAGE_NAME], errors=(400, 401, 403, 404, 502, 503))),
    Endpoint("POST", "/v1/images/{name}/pull", pull_image, op(
        "Pull an image from the node's image registry, every blob verified (by digest: exactly that manifest); "
        "a tampered blob is refused (502 digest_mismatch) and nothing is imported",
        params=[IMAGE_NAME], body=json_body(schemas.IMAGE_PULL), errors=(400, 401, 403, 404, 409, 413, 422, 502, 503))),
    Endpoint("DELETE", "/v1/images/{name}", delete_image, op("Remove an image not in use", params=[IMAGE_NAME],
                                                             errors=(400, 401, 403, 404, 409))),
)


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    """The node server's OpenAPI document, its paths from the route table above."""
    return document(ENDPOINTS)


def build_app(manager: SandboxManager, token: str, multi_user: bool = False, scrape_port: int = 0) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await manager.start()
        try:
            yield
        finally:
            await manager.stop()
            app.state.file_work.close()

    app = Starlette(routes=[e.route() for e in ENDPOINTS], lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    app.add_middleware(Auth, token=token, multi_user=multi_user, scrape_port=scrape_port)
    app.state.manager = manager
    app.state.metrics = ServerMetrics(manager)
    app.state.multi_user = multi_user
    app.state.file_work = FileWork(manager.config.file_work_threads, manager.config.file_work_per_sandbox)
    app.state.node_token = token
    return app


async def on_api_error(request: Request, exc: ApiError):
    return error_response(exc)


async def on_http_error(request: Request, exc: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    return error_response(ApiError(exc.status_code, code, message))


async def on_unexpected(request: Request, exc: Exception):
    if descriptors.is_exhausted(exc):  # says what ran out, not what the failed open() was for
        log.error("out of file descriptors on %s %s: %s", request.method, request.url.path, exc)
        return error_response(descriptors.exhausted_error(exc))
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "internal", "the server failed on this request; it is logged"))


# Every failure as {"error": {...}}: shared with the gateway, which must answer the same way.
EXCEPTION_HANDLERS = {ApiError: on_api_error, HTTPException: on_http_error, Exception: on_unexpected}
