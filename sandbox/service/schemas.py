"""Request bodies: one declaration per route that both validates input and documents it.

Validation answers bad input with a 4xx that names the field and what is wrong; the same
declarations generate the OpenAPI document, so the document cannot drift from what the
server accepts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..common.errors import ApiError
from ..runtime import vocabulary as V

DAY = 86400


@dataclass(frozen=True)
class Field:
    type: type | tuple
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    max_length: int | None = None
    pattern: str | None = None
    items: type | None = None
    item_max_length: int | None = None  # checked when set; the OpenAPI says 500 otherwise
    description: str = ""
    schema: dict | None = None  # the OpenAPI schema of a structured object, checked by its own parser

    def check(self, name: str, value):
        expected = self.type
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and expected is not bool:
            raise ApiError(422, "invalid_request", f"field {name!r} must be {_type_name(expected)}, not a boolean")
        if not isinstance(value, expected):
            raise ApiError(422, "invalid_request", f"field {name!r} must be {_type_name(expected)}, got {type(value).__name__}")
        if self.minimum is not None and value < self.minimum:
            raise ApiError(422, "invalid_request", f"field {name!r} must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ApiError(422, "invalid_request", f"field {name!r} must be at most {self.maximum}, got {value}")
        if self.max_length is not None and len(value) > self.max_length:
            raise ApiError(422, "invalid_request", f"field {name!r} is longer than {self.max_length}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ApiError(422, "invalid_request", f"field {name!r} must match {self.pattern}")
        if self.items is not None:
            for item in value:
                if not isinstance(item, self.items):
                    raise ApiError(422, "invalid_request", f"every item of {name!r} must be {_type_name(self.items)}")
                if self.item_max_length is not None and len(item) > self.item_max_length:
                    raise ApiError(422, "invalid_request", f"an item of {name!r} is longer than {self.item_max_length}")
        return value

    def openapi(self) -> dict:
        kind = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}[self.type]
        schema: dict = {"type": kind}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.max_length is not None:
            schema[{"string": "maxLength", "object": "maxProperties"}.get(kind, "maxItems")] = self.max_length
        if self.pattern is not None:
            schema["pattern"] = f"^{self.pattern}$"
        if self.items is not None:
            schema["items"] = {"type": {str: "string"}[self.items], "maxLength": self.item_max_length or 500}
        if self.schema is not None:
            schema.update(self.schema)
        if self.description:
            schema["description"] = self.description
        return schema


def _type_name(t) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
            list: "an array"}.get(t, str(t))


IMAGE_NAME = r"[a-z0-9][a-z0-9._-]{0,62}"

# The create body's egress policy (checked by sandbox/egress/policy.py, which says what is wrong).
EGRESS = {
    "additionalProperties": False,
    "properties": {
        "allow": {"type": "array", "maxItems": 256, "items": {"type": "string", "maxLength": 300},
                  "description": "Host names ('api.example.org'), subdomains ('*.example.org'), with ports "
                                 "('example.org:8443', default 80 and 443), or addresses/networks ('10.1.0.0/16') "
                                 "that may be reached although not public."},
        "secrets": {"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 128},
                    "description": "Registered secrets (PUT /v1/secrets/{name}) the sandbox sees as placeholders, in an "
                                   "environment variable of that name."},
        "pip": {"type": "boolean", "description": "Allow the package index the server's pip uses; pip installs into "
                                                  "the sandbox's own writable layer."},
        "max_requests": {"type": "integer", "minimum": 1, "description": "Requests (CONNECTs) the sandbox may make."},
        "max_bytes": {"type": "integer", "minimum": 1, "description": "Bytes in and out the sandbox may move."},
    },
}

CREATE = {
    "image": Field(str, pattern=IMAGE_NAME, description="Image name (default: 'default')."),
    "ttl_seconds": Field(int, minimum=1, maximum=14 * DAY, description="Idle time before the sandbox ends; every execute renews it."),
    "max_lifetime_seconds": Field(int, minimum=1, maximum=14 * DAY, description="Absolute cap on the sandbox's life."),
    "memory_mb": Field(int, minimum=64, maximum=1024 * 1024),
    "cpus": Field(float, minimum=0.05, maximum=1024),
    "pids": Field(int, minimum=16, maximum=1 << 22),
    "disk_mb": Field(int, minimum=16, maximum=1 << 24),
    "metadata": Field(dict, description="Free-form labels, returned as given."),
    "end_with_caller": Field(bool, description="End the sandbox as soon as the process that created it exits "
                                               "(unix socket only: the kernel's link; default false)."),
    "egress": Field(dict, schema=EGRESS, description="Network access through the server's egress proxy, to the "
                    "listed hosts only (default: none, no network at all)."),
    "isolation": Field(str, pattern="|".join(V.BACKENDS), description="The isolation backend: 'bwrap' "
                       "(namespaces and seccomp on the host kernel) or 'gvisor' (runsc: a kernel of its own between "
                       "the code and the host's; can pause). Default: the server's default_isolation."),
    "on_idle": Field(str, pattern="|".join(V.ON_IDLE), description="What the idle TTL does when it runs out: "
                     "'delete' (the default) or 'pause' (gvisor only: checkpoint to disk, restored on the next call; "
                     "the maximum lifetime still applies)."),
    "from_save": Field(str, pattern=r"sv-[0-9a-f]{16}", description="A save of yours (POST /v1/sandboxes/{id}/save) "
                       "to load into the new sandbox, inside it; the answer's `restored` says what came back, what "
                       "did not, and how old the save is."),
}
SAVE = {"label": Field(str, max_length=512, description="Your name for the save (a notebook's, an agent's "
                       "task's); GET /v1/saves?label= finds it.")}
RESTORE = {"save_id": Field(str, required=True, pattern=r"sv-[0-9a-f]{16}", description="The save to load.")}
#: A fork takes the source's image, limits and isolation; its own life and labels may differ.
FORK = {k: CREATE[k] for k in ("ttl_seconds", "max_lifetime_seconds", "metadata")}
SECRET = {
    "value": Field(str, required=True, max_length=16 * 1024, description="The secret; never returned, logged or "
                   "given to a sandbox."),
    "hosts": Field(list, required=True, items=str, max_length=64, item_max_length=253,
                   description="Host names ('api.example.org', '*.example.org') whose requests get the value."),
}
_MSG_ID = Field(str, max_length=V.NAME_MAX_CHARS, description=(
    "The caller's id for this request (a Jupyter kernel passes its request's msg_id): code in the sandbox "
    "sees it as the parent message's id, which ipywidgets' Output widget captures output by."))
EXECUTE = {
    "code": Field(str, required=True, max_length=1 << 20),
    "timeout_seconds": Field(float, minimum=0.1, maximum=14 * DAY,
                             description="Per-execute timeout; time spent waiting for an answer to input() does not count."),
    "silent": Field(bool),
    "store_history": Field(bool),
    "allow_stdin": Field(bool, description="input() and getpass() ask the caller: an input_request event, "
                         "answered with POST /v1/sandboxes/{id}/input. Otherwise they raise StdinNotImplementedError."),
    "user_expressions": Field(dict, max_length=V.USER_EXPRESSIONS_MAX, description=(
        "Name -> Python expression (strings), evaluated after the code if it succeeded; the values "
        "(MIME bundles, or errors) come back in done's user_expressions.")),
    "msg_id": _MSG_ID,
    "stream_limit": Field(int, minimum=0, maximum=1 << 40, description=(
        "Bytes of stdout/stderr text this execute may send before the rest is dropped in the sandbox, with a "
        "note saying how much (within the output limit, which still counts everything). A notebook's kernel "
        "asks for less than the Jupyter server's IOPub rate limit, so a huge print ends with that note "
        "rather than the server's 'IOPub data rate exceeded'.")),
}
#: A comm message from the frontend (ipywidgets): queued with executes, run like one.
COMM = {
    "msg_type": Field(str, required=True, pattern="comm_open|comm_msg|comm_close"),
    "comm_id": Field(str, required=True, max_length=V.NAME_MAX_CHARS),
    "data": Field(dict),
    "metadata": Field(dict),
    "buffers": Field(list, items=str, max_length=V.COMM_BUFFERS_MAX, item_max_length=16 << 20,
                     description="Binary buffers, base64."),
    "target_name": Field(str, max_length=V.NAME_MAX_CHARS, description="comm_open: the target registered in the sandbox."),
    "msg_id": _MSG_ID,
    "timeout_seconds": Field(float, minimum=0.1, maximum=14 * DAY),
}


def check_user_expressions(data: dict) -> None:
    """user_expressions maps names to expressions, both strings."""
    for name, expression in (data.get("user_expressions") or {}).items():
        if not isinstance(expression, str) or len(expression) > 1 << 16 or len(name) > V.NAME_MAX_CHARS:
            raise ApiError(422, "invalid_request", f"user_expressions[{name[:40]!r}] must be a string of at most "
                           f"65536 characters, under a name of at most {V.NAME_MAX_CHARS}")


INPUT = {"value": Field(str, required=True, max_length=V.INPUT_MAX_CHARS, description="The answer to input()/getpass().")}
COMMAND = {
    "argv": Field(list, items=str, max_length=4096, item_max_length=1 << 20,
                  description="The program and its arguments, run as given (no shell). Give argv or shell."),
    "shell": Field(str, max_length=1 << 20, description="A command line for /bin/sh -c. Give argv or shell."),
    "cwd": Field(str, max_length=4096, description="Working directory: relative to /workspace, or an absolute "
                 "path under it (default /workspace)."),
    "env": Field(dict, description="Variables added to the sandbox's environment: names [A-Za-z_][A-Za-z0-9_]*, "
                 "string values without NUL."),
    "stdin": Field(str, max_length=1 << 20, description="Standard input as text (UTF-8); none: /dev/null."),
    "stdin_base64": Field(str, max_length=((1 << 20) + 2) // 3 * 4 + 4, description="Standard input as base64 bytes."),
    "timeout_seconds": Field(float, minimum=0.1, maximum=DAY,
                             description="Wall time before the command is stopped (SIGTERM, then SIGKILL); up to 24 h."),
}
RENEW = {
    "ttl_seconds": Field(int, minimum=1, maximum=14 * DAY,
                         description="Change the sliding TTL: from now on every execute renews to this."),
    "extend_seconds": Field(int, minimum=1, maximum=14 * DAY,
                            description="Push expiry this far ahead once; the sliding TTL is unchanged."),
}
COMPLETE = {"code": Field(str, required=True, max_length=1 << 20), "cursor_pos": Field(int, minimum=0, maximum=1 << 20)}
INSPECT = {**COMPLETE, "detail_level": Field(int, minimum=0, maximum=1)}
IS_COMPLETE = {"code": Field(str, required=True, max_length=1 << 20)}
DRAIN = {"draining": Field(bool, description="true (the default): take no new sandboxes; false: take them again.")}
IMAGE_BUILD = {
    "name": Field(str, required=True, pattern=IMAGE_NAME),
    "pip": Field(list, items=str, max_length=200),
    "requirements": Field(str, max_length=1 << 16),
    "preload": Field(list, items=str, max_length=50),
    # an image on a root of its own (images/debian_root.py): Debian and npm packages
    "apt": Field(list, items=str, max_length=200),
    "npm": Field(list, items=str, max_length=200),
    "root": Field(str, max_length=16),
    # an image on a root of its own that this one adds packages to (its root shared, not rebuilt)
    "base": Field(str, pattern=IMAGE_NAME),
}
IMAGE_PULL = {"digest": Field(str, pattern=r"^sha256:[0-9a-f]{64}$",
                             description="Pull exactly this manifest (sha256:HEX, as a push answered); "
                                         "without it, the image's latest.")}


def parse(body: bytes, fields: dict[str, Field], allow_empty: bool = True) -> dict:
    if not body.strip():
        if allow_empty and not any(f.required for f in fields.values()):
            return {}
        raise ApiError(400, "invalid_request", "the request body must be a JSON object")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_request", "the request body must be a JSON object")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ApiError(422, "invalid_request", f"unknown field(s): {', '.join(map(repr, unknown))}; allowed: {', '.join(fields)}")
    out = {}
    for name, field in fields.items():
        if name not in data or data[name] is None:
            if field.required:
                raise ApiError(422, "invalid_request", f"field {name!r} is required")
            continue
        out[name] = field.check(name, data[name])
    return out


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a valid JSON number")


def object_schema(fields: dict[str, Field]) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {name: f.openapi() for name, f in fields.items()},
        "required": [name for name, f in fields.items() if f.required],
    }
