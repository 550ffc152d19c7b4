"""The OpenAPI 3.1 document, generated from the same field declarations that validate requests."""

from __future__ import annotations

from functools import lru_cache

from . import __version__, schemas
from .runtime import vocabulary as V

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"],
                             "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}},
}
SANDBOX_ID = {"name": "sandbox_id", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}}
# 4096 characters, as a path is at most 4096 bytes (sandbox/files.py): its longest spelling,
# percent-encoded in the URL (4-byte characters, 12 URL bytes each), leaves room within the
# HTTP parser's 64 KiB request line, past which uvicorn answers before the API can.
FILE_PATH = {"name": "path", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 4096},
             "description": "Relative to /workspace, in the escaped spelling GET /files lists: a backslash as \\\\, a byte "
                            "that is not UTF-8 or a control byte as \\xHH, the rest as UTF-8 text (sandbox/filenames.py)."}
FILE_LIST = {
    "type": "object", "required": ["files", "count", "truncated", "limit"],
    "properties": {
        "files": {"type": "array", "items": {"type": "object", "required": ["path", "size", "type", "modified"], "properties": {
            "path": {"type": "string", "description": "Escaped spelling (see the path parameter of the files routes)."},
            "size": {"type": "integer"}, "type": {"type": "string", "enum": ["file", "directory", "symlink", "other"]},
            "modified": {"type": "string", "format": "date-time"}}}},
        "count": {"type": "integer", "description": "Entries in this listing."},
        "truncated": {"type": "boolean", "description": "True when the walk stopped at `limit` directory entries."},
        "limit": {"type": "integer"},
    },
}
USAGE = {"type": "object", "properties": {k: {"type": ["number", "null"]} for k in ("total", "used", "free")}
         | {"enforced": {"type": "boolean"}}}
INFO = {
    "type": "object",
    "properties": {
        "host": {"type": "object", "description": "Memory (MiB), CPUs and free disk (MiB, less what live workspaces may still grow by)."},
        "maxima": {"type": "object", "description": "The most one sandbox may ask for here (memory_mb, cpus, pids, disk_mb, "
                                                    "ttl_seconds, max_lifetime_seconds); more gets 422 limit_exceeded."},
        "defaults": {"type": "object", "description": "What a create gets for a limit it does not ask for."},
        "capacity": {"type": "object", "description": "Per resource (memory_mb, cpus, pids, disk_mb, sandboxes): total, used by "
                                                      "live claimed sandboxes, free; past an enforced total, 409 capacity_exceeded.",
                     "additionalProperties": USAGE},
    },
}
COMMAND_ID = {"name": "command_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
IMAGE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
SECRET_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
SECRET_VIEW = {"type": "object", "required": ["name", "hosts"],
               "properties": {"name": {"type": "string"}, "hosts": {"type": "array", "items": {"type": "string"}}},
               "description": "A registered secret: its name and bound hosts, never its value."}


_KIND_SCHEMA = {
    V.Kind.STR: {"type": "string"}, V.Kind.INT: {"type": "integer"}, V.Kind.NUMBER: {"type": "number"},
    V.Kind.BOOL: {"type": "boolean"}, V.Kind.OBJECT: {"type": "object"},
    V.Kind.BUNDLE: {"type": "object", "description": "MIME bundle: text for each type, JSON for JSON types"},
    V.Kind.STR_LIST: {"type": "array", "items": {"type": "string"}},
}


def _field_schema(spec: V.FieldSpec) -> dict:
    schema = dict(_KIND_SCHEMA[spec.kind])
    if spec.choices is not None:
        schema["enum"] = sorted(spec.choices)
    if spec.nullable:
        schema = {"oneOf": [schema, {"type": "null"}]}
    return schema


def execute_event_schema() -> dict:
    """One NDJSON line of an execute, generated from the protocol vocabulary."""
    variants = []
    for kind in sorted(V.EXECUTE_EVENTS):
        fields = {k: f for k, f in V.EVENT_FIELDS[kind].items() if k != "exec"}
        if kind == V.DONE:
            fields.update(V.DONE_EXTRA_FIELDS)
        variants.append({"type": "object", "title": kind,
                         "required": ["type", *sorted(k for k, f in fields.items() if f.required)],
                         "properties": {"type": {"const": kind}, **{k: _field_schema(f) for k, f in fields.items()}}})
    return {"oneOf": variants}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for c in codes}


def _json_body(fields: dict) -> dict:
    return {"required": False, "content": {"application/json": {"schema": schemas.object_schema(fields)}}}


def _op(summary: str, ok: str = "200", body: dict | None = None, params=(), errors=(401, 404, 410, 422),
        content: str = "application/json", ok_schema: dict | None = None) -> dict:
    op = {"summary": summary, "parameters": list(params),
          "responses": {ok: {"description": "success", "content": {content: {"schema": ok_schema or {}}}},
                        **_errors(*errors)}}
    if body is not None:
        op["requestBody"] = body
    return op


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    sid = [SANDBOX_ID]
    sandbox_ref = {"$ref": "#/components/schemas/Sandbox"}
    paths = {
        "/v1/health": {"get": _op("Liveness (no token needed)", errors=())},
        "/v1/info": {"get": _op("Version, protections in force, warm pool, node id, draining, limits and free capacity", errors=(401,),
                                ok_schema=INFO)},
        "/v1/node/drain": {"post": _op("Drain this node (no new sandboxes; existing ones run out), or undo it",
                                       body=_json_body(schemas.DRAIN), errors=(400, 401, 413, 422))},
        "/v1/sandboxes": {
            "post": _op("Create (or claim from the warm pool) a sandbox; limits over the per-sandbox maxima get 422 "
                        "limit_exceeded, past the server's totals 409 capacity_exceeded", ok="201", body=_json_body(schemas.CREATE),
                        errors=(400, 401, 404, 409, 413, 422, 503), ok_schema=sandbox_ref),
            "get": _op("List live sandboxes", errors=(401,)),
        },
        "/v1/sandboxes/{sandbox_id}": {
            "get": _op("Status of one sandbox", params=sid, ok_schema=sandbox_ref),
            "delete": _op("Delete a sandbox and kill all of its processes", params=sid),
        },
        "/v1/sandboxes/{sandbox_id}/renew": {"post": _op("Renew the TTL", params=sid, body=_json_body(schemas.RENEW), errors=(400, 401, 404, 410, 413, 422))},
        "/v1/sandboxes/{sandbox_id}/interrupt": {"post": _op("Interrupt the running cell", params=sid)},
        "/v1/sandboxes/{sandbox_id}/pause": {"post": _op(
            "Pause a gvisor sandbox: checkpoint its live interpreter to disk and free its memory; the next call "
            "restores it. 409 with a reason (not_supported, busy, not_running, checkpoint_failed) when it cannot",
            params=sid, errors=(401, 404, 409, 410), ok_schema=sandbox_ref)},
        "/v1/sandboxes/{sandbox_id}/resume": {"post": _op(
            "Restore a paused sandbox now (any other call does it too); 409 version_mismatch when its checkpoint "
            "was taken under another runsc or image", params=sid, errors=(401, 404, 409, 410, 503),
            ok_schema=sandbox_ref)},
        "/v1/sandboxes/{sandbox_id}/execute": {"post": _op("Run code; events stream as NDJSON", params=sid,
                                                           body=_json_body(schemas.EXECUTE), content="application/x-ndjson",
                                                           errors=(400, 401, 404, 410, 413, 422),
                                                           ok_schema={"$ref": "#/components/schemas/ExecuteEvent"})},
        "/v1/sandboxes/{sandbox_id}/commands": {
            "post": _op("Run a program (argv or a shell line) beside the interpreter; start, stdout/stderr "
                        "and done (exit_code, timed_out, duration) stream as NDJSON", params=sid,
                        body=_json_body(schemas.COMMAND), content="application/x-ndjson",
                        errors=(400, 401, 404, 409, 410, 413, 422, 429, 503)),
            "get": _op("Commands running now", params=sid),
        },
        "/v1/sandboxes/{sandbox_id}/commands/{command_id}/interrupt": {
            "post": _op("Interrupt a running command (SIGINT to its process group, SIGKILL after 2 s)",
                        params=[SANDBOX_ID, COMMAND_ID])},
        "/v1/sandboxes/{sandbox_id}/complete": {"post": _op("Completions at a cursor", params=sid, body=_json_body(schemas.COMPLETE), errors=(400, 401, 404, 410, 413, 422))},
        "/v1/sandboxes/{sandbox_id}/inspect": {"post": _op("Object inspection at a cursor", params=sid, body=_json_body(schemas.INSPECT), errors=(400, 401, 404, 410, 413, 422))},
        "/v1/sandboxes/{sandbox_id}/is_complete": {"post": _op("Whether code is a complete statement", params=sid, body=_json_body(schemas.IS_COMPLETE), errors=(400, 401, 404, 410, 413, 422))},
        "/v1/sandboxes/{sandbox_id}/files": {"get": _op("List /workspace (recursive, capped at files_list_max entries)",
                                                        params=sid, ok_schema=FILE_LIST)},
        "/v1/sandboxes/{sandbox_id}/files/{path}": {
            "put": _op("Upload a file (streamed raw body)", ok="201", params=[SANDBOX_ID, FILE_PATH],
                       body={"required": False, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                       errors=(400, 401, 404, 410, 413, 507)),
            "get": _op("Download a file (streamed)", params=[SANDBOX_ID, FILE_PATH], content="application/octet-stream", errors=(400, 401, 404, 410)),
            "delete": _op("Delete a file or directory", params=[SANDBOX_ID, FILE_PATH], errors=(400, 401, 404, 409, 410)),
        },
        "/v1/secrets": {"get": _op("List your registered secrets (names and hosts; never a value)", errors=(401,),
                                   ok_schema={"type": "object", "properties": {"secrets": {"type": "array", "items": SECRET_VIEW}}})},
        "/v1/secrets/{name}": {
            "put": _op("Register or replace a secret bound to hosts; sandboxes that name it in egress.secrets see a "
                       "placeholder, which the egress proxy replaces in request headers to those hosts only",
                       params=[SECRET_NAME], body={"required": True, "content": {"application/json": {
                           "schema": schemas.object_schema(schemas.SECRET)}}},
                       errors=(400, 401, 413, 422), ok_schema=SECRET_VIEW),
            "delete": _op("Forget a secret (sandboxes holding its placeholder no longer get the value)",
                          params=[SECRET_NAME], errors=(401, 404)),
        },
        "/v1/images": {
            "get": _op("List images", errors=(401,)),
            "post": _op("Build an image (progress streams as NDJSON)", body=_json_body(schemas.IMAGE_BUILD),
                        content="application/x-ndjson", errors=(400, 401, 403, 413, 422)),
        },
        "/v1/images/{name}": {
            "get": _op("One image", params=[IMAGE_NAME], errors=(401, 404)),
            "delete": _op("Remove an image not in use", params=[IMAGE_NAME], errors=(400, 401, 403, 404, 409)),
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "sandbox-kernel", "version": __version__,
                 "description": "Stateful Python sandboxes: create, execute (NDJSON events), files, lifecycle."},
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR, "ExecuteEvent": execute_event_schema(), "Sandbox": {"type": "object", "required": ["id", "state"],
                                                    "properties": {"id": {"type": "string"}, "state": {"type": "string"}}}},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
