"""Checks a frame from a sandbox against the vocabulary, within a fixed memory budget.

The supervisor is the first host process that reads sandbox bytes, and a cell can write
anything to its runtime's channel. ``json.loads`` of 39 MB of ``[{},{},…]`` builds 13
million dicts (gigabytes); 100000 nested ``[`` raise RecursionError; a well-formed frame
can still say ``data: [1, 2]`` or ``execution_count: "NaN"``. So a frame is checked in
steps that each cost at most a copy of the frame, at C speed, before anything is built:

1. its size, from the header, before it is read (``frame_limit``);
2. its structure: ``bytes.count`` of ``{``, ``[`` and ``,`` bounds how many containers and
   items it can hold; only when those counts are high are the strings cut out (one regular
   expression) to count exactly, and its nesting depth measured on the brackets alone;
3. strict JSON (no NaN or Infinity), which must be an object;
4. its fields, against ``vocabulary.EVENT_FIELDS`` (and ``REPLY_FIELDS``).

A frame that fails raises ``Violation`` with words that say what was wrong. The runtime
runs the same checks on what it is about to send and trims instead (``runtime.py``), so a
sandbox's own runtime never sends a frame its supervisor refuses. Standard library only:
this module is copied into every sandbox with the runtime.
"""

from __future__ import annotations

import json
import re

from . import vocabulary as V
from .protocol import ProtocolError

MAX_DEPTH = 64            # nesting of objects and arrays in one frame
MAX_CONTAINERS = 20_000   # objects and arrays in one frame
MAX_ITEMS = 200_000       # array elements and object members in one frame
FRAME_CEILING = 16 * 1024 * 1024  # no frame from a sandbox is larger, whatever the output cap
FRAME_SLACK = 64 * 1024   # room for the envelope of an event that fills the output cap
FRAME_OVERHEAD = 64       # what a frame costs beyond its bytes, so a flood of tiny ones is counted

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class Violation(ProtocolError):
    """A frame that breaks the protocol; the message says how."""


def frame_limit(output_bytes: int) -> int:
    """The largest frame a sandbox may send: one event can hold at most the output cap."""
    return min(int(output_bytes), FRAME_CEILING) + FRAME_SLACK


def frame_cost(payload_bytes: int) -> int:
    """What a frame counts against an execute's output budget."""
    return payload_bytes + FRAME_OVERHEAD


def scan(payload: bytes) -> None:
    """Refuse a payload whose structure is too large or too deep, before it is parsed."""
    opens = payload.count(b"{") + payload.count(b"[")
    commas = payload.count(b",")
    if opens <= MAX_DEPTH and commas <= MAX_ITEMS:
        return  # too few brackets to nest deeper, too few commas for more items
    skeleton = _STRING.sub(b'""', payload)  # brackets and commas inside strings are text
    containers = skeleton.count(b"{") + skeleton.count(b"[")
    if containers > MAX_CONTAINERS:
        raise Violation(f"the frame holds {containers} objects and arrays; at most {MAX_CONTAINERS} are allowed")
    items = skeleton.count(b",") + containers
    if items > MAX_ITEMS:
        raise Violation(f"the frame holds about {items} items; at most {MAX_ITEMS} are allowed")
    if containers > MAX_DEPTH:
        depth = deepest = 0
        for byte in skeleton.translate(None, _NOT_BRACKETS):
            if byte in b"[{":
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if deepest > MAX_DEPTH:
                        raise Violation(f"the frame nests objects and arrays deeper than {MAX_DEPTH} levels")
            else:
                depth -= 1


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


# One decoder for every frame: ``json.loads`` with a hook builds a decoder per call, which
# was a third of the supervisor's cost of a tiny frame.
_STRICT = json.JSONDecoder(parse_constant=_no_constant)


def parse(payload: bytes) -> dict:
    """Strict JSON of a scanned payload: an object, no NaN or Infinity."""
    try:
        # UTF-8 as json.loads reads bytes (surrogatepass), without its guess at UTF-16 or -32
        message = _STRICT.decode(payload.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Violation(f"the frame is not valid JSON ({exc})") from None
    if not isinstance(message, dict):
        raise Violation(f"the frame is a JSON {type(message).__name__}, not an object")
    return message


_LIST_ITEMS = {V.Kind.STR_LIST: (str, "strings"), V.Kind.OBJECT_LIST: (dict, "objects")}


def _kind_problem(spec: V.FieldSpec, value) -> str | None:
    if value is None:
        return None if spec.nullable else "must not be null"
    kind = spec.kind
    if kind == V.Kind.STR:
        if not isinstance(value, str):
            return f"must be a string, got {_json_type(value)}"
        if spec.choices is not None and value not in spec.choices:
            return f"must be one of {', '.join(sorted(spec.choices))}, got {value[:40]!r}"
        return None
    if kind == V.Kind.INT:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"must be an integer, got {_json_type(value)}"
    if kind == V.Kind.NUMBER:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"must be a number, got {_json_type(value)}"
    if kind == V.Kind.BOOL:
        return None if isinstance(value, bool) else f"must be true or false, got {_json_type(value)}"
    if kind == V.Kind.OBJECT:
        return None if isinstance(value, dict) else f"must be an object, got {_json_type(value)}"
    if kind in _LIST_ITEMS:
        item_type, what = _LIST_ITEMS[kind]
        if not isinstance(value, list):
            return f"must be an array of {what}, got {_json_type(value)}"
        for item in value:
            if not isinstance(item, item_type):
                return f"must be an array of {what}, holds {_json_type(item)}"
        return None
    if kind == V.Kind.BUNDLE:
        if not isinstance(value, dict):
            return f"must be an object (a MIME bundle), got {_json_type(value)}"
        for mime, item in value.items():
            if not isinstance(item, str) and not V.is_json_mime(mime):
                return f"must map {mime[:60]!r} to a string, got {_json_type(item)}"
        return None
    return f"has an unknown kind {kind!r}"


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def check(message: dict, fields_of: dict | None = None) -> None:
    """Refuse a message whose type or fields are not the vocabulary's."""
    kind = message.get("type")
    if kind == V.REPLY:
        fields = V.REPLY_FIELDS
    else:
        fields = (fields_of or V.EVENT_FIELDS).get(kind) if isinstance(kind, str) else None
        if fields is None:
            raise Violation(f"the frame's type {str(kind)[:40]!r} is not one a sandbox sends")
    for name, value in message.items():
        if name == "type":
            continue
        spec = fields.get(name)
        if spec is None:
            raise Violation(f"a {kind} frame has no field {name[:40]!r}")
        problem = _kind_problem(spec, value)
        if problem is None and spec.max_len is not None and isinstance(value, (str, list)) \
                and len(value) > spec.max_len:
            problem = f"holds {len(value)} {'characters' if isinstance(value, str) else 'items'}; at most {spec.max_len}"
        if problem:
            raise Violation(f"a {kind} frame's field {name!r} {problem}")
    for name, spec in fields.items():
        if spec.required and name not in message:
            raise Violation(f"a {kind} frame lacks its field {name!r}")


def load(payload: bytes) -> dict:
    """A payload from a sandbox, scanned, parsed and checked; Violation says what was wrong."""
    scan(payload)
    message = parse(payload)
    check(message)
    return message
