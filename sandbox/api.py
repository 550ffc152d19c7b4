"""HTTP routes: the thin layer that turns requests into manager calls and errors into JSON.

Every failure leaves as ``{"error": {"code", "message"}}`` with a 4xx/5xx status, whether it
came from validation, the manager, Starlette's routing or an unexpected bug (logged, and
answered with a 500 that leaks nothing). Who the caller is (peer uid on the unix socket,
bearer token on TCP) is sandbox/auth.py's job; on a shared server a tenant's request for
another user's sandbox is answered exactly as for an unknown id (404), so ids do not leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import __version__, commands, schemas
from .auth import Auth, caller_of
from .errors import ApiError
from .files import Workspace
from .images import ImageError
from .manager import SandboxManager
from .openapi import openapi_document
from .runtime import vocabulary as V

log = logging.getLogger("sandbox.api")
NDJSON = "application/x-ndjson"


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
    """The ``{path}`` of a files route, in the escaped spelling of sandbox/filenames.py.

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


def build_app(manager: SandboxManager, token: str, multi_user: bool = False) -> Starlette:
    config = manager.config

    async def body(request: Request, fields) -> dict:
        return schemas.parse(await read_body(request, config.request_max_bytes), fields)

    def visible(request: Request):
        """The sandbox named in the path, as it is (a paused one stays paused)."""
        sandbox_id = request.path_params["sandbox_id"]
        if not caller_of(request).may_see(manager.owner_of(sandbox_id)):
            raise manager.not_found(sandbox_id)
        return manager.get(sandbox_id)

    async def live(request: Request):
        """The sandbox named in the path, running: a paused one is restored first."""
        handle = visible(request)
        await manager.wake(handle)
        return handle

    def admin_only(request: Request, what: str) -> None:
        caller = caller_of(request)
        if caller.tenant is not None:
            raise ApiError(403, "forbidden", f"{what} is for the server's administrator on a shared server "
                                             f"(you are {caller.label})")

    async def health(request: Request):
        return JSONResponse({"status": "ok", "version": __version__})

    async def info(request: Request):
        caller = caller_of(request)
        return JSONResponse({"version": __version__, "state_dir": manager.state.root,
                             "protections": manager.protections, "pool": manager.pool_status(),
                             "sandboxes": len([h for h in manager.list() if caller.may_see(manager.owner_of(h.id))]),
                             "node_id": config.node_id or None, "draining": manager.draining,
                             "multi_user": multi_user, "caller": caller.label, **manager.capacity_report()})

    async def drain(request: Request):
        admin_only(request, "draining the node")
        data = await body(request, schemas.DRAIN)
        manager.draining = data.get("draining", True)
        return JSONResponse({"node_id": config.node_id or None, "draining": manager.draining,
                             "sandboxes": len(manager.list())})

    async def openapi(request: Request):
        return JSONResponse(openapi_document())

    async def create(request: Request):
        data = await body(request, schemas.CREATE)
        caller = caller_of(request)
        if data.get("end_with_caller") and caller.peer is None:
            raise ApiError(422, "invalid_request", "end_with_caller needs the server's unix socket, where the server "
                                                   "knows the calling process; over TCP it cannot")
        return JSONResponse(await manager.create(data, owner=caller.tenant, caller=caller.peer), status_code=201)

    async def put_secret(request: Request):
        data = await body(request, schemas.SECRET)
        secret = manager.egress.secrets.put(request.path_params["name"], data["value"], data["hosts"],
                                            owner=caller_of(request).tenant)
        return JSONResponse(secret.describe())

    async def list_secrets(request: Request):
        return JSONResponse({"secrets": manager.egress.secrets.list(caller_of(request).tenant)})

    async def delete_secret(request: Request):
        manager.egress.secrets.delete(request.path_params["name"], caller_of(request).tenant)
        return JSONResponse({"name": request.path_params["name"], "deleted": True})

    async def list_sandboxes(request: Request):
        caller = caller_of(request)
        return JSONResponse({"sandboxes": [manager.describe(h) for h in manager.list() if caller.may_see(manager.owner_of(h.id))]})

    async def get_sandbox(request: Request):
        return JSONResponse(await manager.refresh(visible(request)))

    async def delete_sandbox(request: Request):
        visible(request)
        return JSONResponse(await manager.delete(request.path_params["sandbox_id"]))

    async def renew(request: Request):
        handle = await live(request)
        data = await body(request, schemas.RENEW)
        for key in ("ttl_seconds", "extend_seconds"):  # an extension is a TTL, once
            if data.get(key, 0) > config.max_ttl_seconds:
                raise ApiError(422, "limit_exceeded", f"{key} {data[key]} is more than a sandbox may have here "
                               f"(at most {config.max_ttl_seconds}, max_ttl_seconds)",
                               extra={"exceeded": {key: {"requested": data[key], "allowed": config.max_ttl_seconds,
                                                         "set_by": "max_ttl_seconds"}}})
        await manager.call(handle, {"op": "renew", **data})
        return JSONResponse(manager.describe(handle))

    async def pause(request: Request):
        return JSONResponse(await manager.pause(visible(request)))

    async def resume(request: Request):
        handle = visible(request)
        await manager.wake(handle)
        return JSONResponse(manager.describe(handle))

    async def interrupt(request: Request):
        reply = await manager.call(await live(request), {"op": "interrupt"})
        return JSONResponse({"interrupted": reply.get("interrupted", False)})

    def forwarder(op: str, fields, keys):
        async def handler(request: Request):
            handle = await live(request)
            data = await body(request, fields)
            reply = await manager.call(handle, {"op": op, **data})
            return JSONResponse({k: reply.get(k) for k in keys if k in reply})
        return handler

    async def execute(request: Request):
        handle = visible(request)
        data = await body(request, schemas.EXECUTE)
        restored = await manager.wake(handle)
        events = await manager.open_execute(handle, data)

        async def lines():
            if restored:  # the first call after a pause waited for the restore: say so
                yield json.dumps(V.stream_event(V.STDERR, restored)) + "\n"
            async for event in events:
                yield json.dumps(event, ensure_ascii=False) + "\n"

        return StreamingResponse(lines(), media_type=NDJSON, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def run_command(request: Request):
        handle = await live(request)
        # Room for the largest stdin as base64 on top of the usual body limit.
        raw = await read_body(request, config.request_max_bytes + commands.MAX_STDIN_BASE64)
        data = commands.prepare(schemas.parse(raw, schemas.COMMAND))
        events = await manager.open_command(handle, data)

        async def lines():
            async for event in events:
                yield json.dumps(event, ensure_ascii=False) + "\n"

        return StreamingResponse(lines(), media_type=NDJSON, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def list_commands(request: Request):
        reply = await manager.call(await live(request), {"op": "commands"})
        return JSONResponse({"commands": reply.get("commands", [])})

    async def interrupt_command(request: Request):
        reply = await manager.call(await live(request), {"op": "command_interrupt",
                                                   "command_id": request.path_params["command_id"]})
        return JSONResponse({"interrupted": reply.get("interrupted", False)})

    def workspace(handle) -> Workspace:
        return Workspace(handle.dir + "/workspace", handle.uid, config.file_max_bytes)

    async def put_file(request: Request):
        handle = await live(request)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > config.file_max_bytes:
            raise ApiError(413, "too_large", f"the file is larger than the {config.file_max_bytes} byte limit for one file")
        result = await workspace(handle).write(file_path(request), request.stream())
        return JSONResponse(result, status_code=201)

    async def get_file(request: Request):
        ws = workspace(await live(request))
        fd, size = ws.open_for_read(file_path(request))
        return StreamingResponse(ws.read_chunks(fd), media_type="application/octet-stream",
                                 headers={"Content-Length": str(size)})

    async def list_files(request: Request):
        return JSONResponse(await asyncio.to_thread(workspace(await live(request)).list, config.files_list_max))

    async def delete_file(request: Request):
        ws = workspace(await live(request))
        return JSONResponse(await asyncio.to_thread(ws.delete, file_path(request)))

    async def list_images(request: Request):
        return JSONResponse({"images": [_image_view(i, manager) for i in manager.images.list()]})

    async def get_image(request: Request):
        info = manager.images.get(request.path_params["name"])
        if info is None:
            raise ApiError(404, "not_found", f"no image named {request.path_params['name']!r}")
        return JSONResponse(_image_view(info, manager))

    async def build_image(request: Request):
        admin_only(request, "building an image")
        data = await body(request, schemas.IMAGE_BUILD)
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def progress(line: str) -> None:
            if "WARNING: Location" not in line:
                loop.call_soon_threadsafe(queue.put_nowait, {"type": "progress", "message": line})

        def run():
            try:
                info = manager.images.build(data["name"], pip=data.get("pip", []), requirements=data.get("requirements"),
                                            preload=data.get("preload"), progress=progress)
                result = {"type": "done", "status": "ok", "image": _image_view(info, manager)}
            except ImageError as exc:
                result = {"type": "done", "status": "error", "error": {"code": exc.code, "message": str(exc)}}
            except Exception as exc:  # pip or the disk failed: say so, keep serving
                log.exception("image build failed")
                result = {"type": "done", "status": "error", "error": {"code": "build_failed", "message": str(exc)}}
            loop.call_soon_threadsafe(queue.put_nowait, result)

        async def events():
            task = asyncio.create_task(asyncio.to_thread(run))
            while True:
                event = await queue.get()
                yield json.dumps(event) + "\n"
                if event["type"] == "done":
                    break
            await task
            manager._refill_soon()

        return StreamingResponse(events(), media_type=NDJSON)

    async def delete_image(request: Request):
        admin_only(request, "removing an image")
        name = request.path_params["name"]
        try:
            manager.images.remove(name, manager.in_use)
        except ImageError as exc:
            raise ApiError({"not_found": 404, "conflict": 409}.get(exc.code, 400), exc.code, str(exc)) from None
        # pooled sandboxes of that image are not "in use": end them with it
        for sandbox_id in list(manager.pool.pop(name, [])):
            if sandbox_id in manager.live:
                await manager.end(manager.live[sandbox_id], "its image was removed")
        return JSONResponse({"name": name, "deleted": True})

    sid = "/v1/sandboxes/{sandbox_id}"
    routes = [
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/info", info, methods=["GET"]),
        Route("/v1/node/drain", drain, methods=["POST"]),
        Route("/v1/openapi.json", openapi, methods=["GET"]),
        Route("/v1/sandboxes", create, methods=["POST"]),
        Route("/v1/sandboxes", list_sandboxes, methods=["GET"]),
        Route(sid, get_sandbox, methods=["GET"]),
        Route(sid, delete_sandbox, methods=["DELETE"]),
        Route(sid + "/renew", renew, methods=["POST"]),
        Route(sid + "/interrupt", interrupt, methods=["POST"]),
        Route(sid + "/pause", pause, methods=["POST"]),
        Route(sid + "/resume", resume, methods=["POST"]),
        Route(sid + "/execute", execute, methods=["POST"]),
        Route(sid + "/commands", run_command, methods=["POST"]),
        Route(sid + "/commands", list_commands, methods=["GET"]),
        Route(sid + "/commands/{command_id}/interrupt", interrupt_command, methods=["POST"]),
        Route(sid + "/complete", forwarder("complete", schemas.COMPLETE, ("matches", "cursor_start", "cursor_end", "metadata")), methods=["POST"]),
        Route(sid + "/inspect", forwarder("inspect", schemas.INSPECT, ("found", "data", "metadata")), methods=["POST"]),
        Route(sid + "/is_complete", forwarder("is_complete", schemas.IS_COMPLETE, ("status", "indent")), methods=["POST"]),
        Route(sid + "/files", list_files, methods=["GET"]),
        Route(sid + "/files/{path:path}", put_file, methods=["PUT"]),
        Route(sid + "/files/{path:path}", get_file, methods=["GET"]),
        Route(sid + "/files/{path:path}", delete_file, methods=["DELETE"]),
        Route("/v1/secrets", list_secrets, methods=["GET"]),
        Route("/v1/secrets/{name}", put_secret, methods=["PUT"]),
        Route("/v1/secrets/{name}", delete_secret, methods=["DELETE"]),
        Route("/v1/images", list_images, methods=["GET"]),
        Route("/v1/images", build_image, methods=["POST"]),
        Route("/v1/images/{name}", get_image, methods=["GET"]),
        Route("/v1/images/{name}", delete_image, methods=["DELETE"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await manager.start()
        try:
            yield
        finally:
            await manager.stop()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers=EXCEPTION_HANDLERS)
    app.add_middleware(Auth, token=token, multi_user=multi_user)
    app.state.manager = manager
    return app


async def on_api_error(request: Request, exc: ApiError):
    return error_response(exc)


async def on_http_error(request: Request, exc: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    return error_response(ApiError(exc.status_code, code, message))


async def on_unexpected(request: Request, exc: Exception):
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "internal", "the server failed on this request; it is logged"))


# Every failure as {"error": {...}}: shared with the gateway, which must answer the same way.
EXCEPTION_HANDLERS = {ApiError: on_api_error, HTTPException: on_http_error, Exception: on_unexpected}


def _image_view(info: dict, manager: SandboxManager) -> dict:
    return {k: info.get(k) for k in ("name", "base", "pip", "preload", "packages", "built_at", "size_bytes", "python_version")} | {
        "in_use": manager.in_use(info["name"]), "pool": manager.pool_target(info["name"])}
