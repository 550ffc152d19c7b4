"""The OpenAPI 3.1 document, generated from the route table (``api.ENDPOINTS``) and the same
field declarations that validate requests."""

from __future__ import annotations

import re

from .. import __version__
from . import schemas
from ..runtime import vocabulary as V
from ..usage import meter, store as usage_store

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"],
                             "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                                            # 410 gone: how the sandbox ended, and when
                                            "state": {"type": "string"}, "reason": {"type": "string"},
                                            "ended_at": {"type": ["string", "null"], "format": "date-time"}}}},
}
SANDBOX_ID = {"name": "sandbox_id", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}}
# 4096 characters, as a path is at most 4096 bytes (sandbox/core/files.py): its longest spelling,
# percent-encoded in the URL (4-byte characters, 12 URL bytes each), leaves room within the
# HTTP parser's 64 KiB request line, past which uvicorn answers before the API can.
FILE_PATH = {"name": "path", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 4096},
             "description": "Relative to /workspace, in the escaped spelling GET /files lists: a backslash as \\\\, a byte "
                            "that is not UTF-8 or a control byte as \\xHH, the rest as UTF-8 text (sandbox/common/filenames.py)."}
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
SANDBOX_SCOPE = {"name": "Sandbox-Scope", "in": "header", "required": False,
                 "schema": {"type": "string", "maxLength": 4096},
                 "description": "own[, other...]: a scoped caller (an agent's tools) reaches only sandboxes labelled with "
                                "one of these scopes ('*' among the others: any; 'NAME:*': any label NAME:...); "
                                "what it creates is labelled `own`. Others' sandboxes answer 404 and are not listed "
                                "(sandbox/service/scopes.py)."}
COMMAND_ID = {"name": "command_id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
SAVE_ID = {"name": "save_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^sv-[0-9a-f]{16}$"}}
LABEL = {"name": "label", "in": "query", "required": False, "schema": {"type": "string", "maxLength": 512}}
IMAGE_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}}
SANDBOX_REF = {"$ref": "#/components/schemas/Sandbox"}
SANDBOX_USAGE = {
    "type": "object", "description": "What the sandbox uses, from its cgroup and workspace (docs/api.md, `usage`).",
    "properties": {**{k: {"type": "number"} for k in (*meter.FIELDS, "egress_bytes_in", "egress_bytes_out")},
                   "sampled_at": {"type": ["string", "null"], "format": "date-time"}},
}
USAGE_SINCE = {"name": "since", "in": "query", "required": False, "schema": {"type": "string", "maxLength": 40},
               "description": "An ISO date (2026-12-01) or time (2026-12-01T08:00:00Z), UTC"}
USAGE_SANDBOX = {"name": "sandbox_id", "in": "query", "required": False, "schema": {"type": "string", "maxLength": 64}}
USAGE_RECORDS = {"type": "object", "properties": {"records": {"type": "array", "items": {
    "type": "object", "properties": {name: {"type": ["string", "number", "null"]} for name in usage_store.COLUMNS}}}}}
SANDBOX = {"type": "object", "required": ["id", "state"],
           "properties": {"id": {"type": "string"}, "state": {"type": "string"}, "usage": SANDBOX_USAGE,
                          "scope": {"type": ["string", "null"],
                                    "description": "The scope of the caller that made it (Sandbox-Scope), or null."},
                          "owner": {"type": "object", "properties": {"uid": {"type": "integer"},
                                                                     "name": {"type": "string"}},
                                    "description": "On a --multi-user server only: the user whose sandbox it is."}}}
SECRET_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 128}}
SECRET_VIEW = {"type": "object", "required": ["name", "hosts"],
               "properties": {"name": {"type": "string"}, "hosts": {"type": "array", "items": {"type": "string"}}},
               "description": "A registered secret: its name and bound hosts, never its value."}


_KIND_SCHEMA = {
    V.Kind.STR: {"type": "string"}, V.Kind.INT: {"type": "integer"}, V.Kind.NUMBER: {"type": "number"},
    V.Kind.BOOL: {"type": "boolean"}, V.Kind.OBJECT: {"type": "object"},
    V.Kind.BUNDLE: {"type": "object", "description": "MIME bundle: text for each type, JSON for JSON types"},
    V.Kind.STR_LIST: {"type": "array", "items": {"type": "string"}},
    V.Kind.OBJECT_LIST: {"type": "array", "items": {"type": "object"}},
}


def _field_schema(spec: V.FieldSpec) -> dict:
    schema = dict(_KIND_SCHEMA[spec.kind])
    if spec.choices is not None:
        schema["enum"] = sorted(spec.choices)
    if spec.max_len is not None:
        schema["maxLength" if spec.kind == V.Kind.STR else "maxItems"] = spec.max_len
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


def error_responses(*codes: int) -> dict:
    return {str(c): {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for c in codes}


def json_body(fields: dict) -> dict:
    return {"required": False, "content": {"application/json": {"schema": schemas.object_schema(fields)}}}


def op(summary: str, ok: str = "200", body: dict | None = None, params=(), errors=(401, 404, 410, 422),
        content: str = "application/json", ok_schema: dict | None = None) -> dict:
    params = [*params, SANDBOX_SCOPE] if SANDBOX_ID in params else list(params)  # every per-sandbox route checks it
    op = {"summary": summary, "parameters": params,
          "responses": {ok: {"description": "success", "content": {content: {"schema": ok_schema or {}}}},
                        **error_responses(*errors)}}
    if body is not None:
        op["requestBody"] = body
    return op


def document(endpoints) -> dict:
    """The OpenAPI document of a route table: each endpoint's ``operation`` under its path
    (``{name:converter}`` written ``{name}``) and method; endpoints without one are left out."""
    paths: dict[str, dict] = {}
    for endpoint in endpoints:
        if endpoint.operation is not None:
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", endpoint.path)
            paths.setdefault(path, {})[endpoint.method.lower()] = endpoint.operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "sandbox-kernel", "version": __version__,
                 "description": "Stateful Python sandboxes: create, execute (NDJSON events), files, lifecycle."},
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR, "ExecuteEvent": execute_event_schema(), "Sandbox": SANDBOX},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
