"""IPython display plumbing that turns rich output into events instead of terminal text.

These mirror ipykernel's ZMQDisplayPublisher and ZMQShellDisplayHook: the shell formats
objects into MIME bundles exactly as it does under Jupyter, and we forward the bundles.
"""

from __future__ import annotations

import base64
import json
import math
import reprlib
import sys

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher

from . import framecheck
from .vocabulary import is_json_mime

BINARY_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")


class TooLarge(Exception):
    """A value whose JSON form would not fit the frame it is meant for."""


class Budget:
    """What one event may still hold once serialized: bytes (counted as the JSON form would
    take them, near enough), and containers and items (a frame's structural limits).

    Cleaning charges it as it goes and stops with `TooLarge` at the first value past it, so
    ``metadata={'m': [{}] * 2_500_000}`` is refused after one ``len()``, before millions of
    copies are built: a display pays for what it could send, never for what it asked for.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.bytes = int(limit_bytes)
        self.containers = framecheck.MAX_CONTAINERS - 64  # room for the event around it
        self.items = framecheck.MAX_ITEMS - 64

    def spend(self, nbytes: int, *, containers: int = 0, items: int = 0) -> None:
        self.bytes -= nbytes
        self.containers -= containers
        self.items -= items
        if self.bytes < 0 or self.containers < 0 or self.items < 0:
            raise TooLarge

    def saved(self) -> tuple[int, int, int]:
        return self.bytes, self.containers, self.items

    def restore(self, saved: tuple[int, int, int]) -> None:
        self.bytes, self.containers, self.items = saved


def clean_bundle(data: dict, limit: int, budget: Budget | None = None) -> tuple[dict, bool]:
    """Make a MIME bundle JSON-safe and within ``limit`` bytes; say whether it was cut. A
    representation that does not fit is dropped (text/plain is kept, cut, with a note)."""
    budget = budget or Budget(limit)
    out: dict = {}
    cut = False
    for mime, value in (data or {}).items():
        mime = str(mime)
        before = budget.saved()
        try:
            value = _jsonable(mime, value, budget)
            if not isinstance(value, str) and not is_json_mime(mime):
                value = json.dumps(value)  # a bundle maps every non-JSON MIME type to text
            if isinstance(value, str):
                budget.spend(len(value) + 2)
        except TooLarge:
            budget.restore(before)
            if mime != "text/plain" or not isinstance(value, str):
                cut = True
                continue
        out[mime] = value
    if cut:
        note = f"\n[sandbox: a rich representation over the {limit // (1024 * 1024)} MiB display limit was dropped]"
        plain = out.get("text/plain")
        out["text/plain"] = (plain if isinstance(plain, str) else "")[: limit // 2] + note
    return out, cut


def clean_metadata(metadata, limit: int = framecheck.FRAME_CEILING, budget: Budget | None = None) -> tuple[dict, bool]:
    """Display metadata (or transient) made JSON-safe: an object, nested no deeper than a
    frame may be (what is deeper is shown as its repr); ``({}, True)`` if it would not fit."""
    if not isinstance(metadata, dict):
        return {}, False
    budget = budget or Budget(limit)
    before = budget.saved()
    try:
        return _json_clean(metadata, budget), False
    except TooLarge:
        budget.restore(before)
        return {}, True


def bundle_fields(data, metadata, limit: int) -> dict:
    """The ``data`` and ``metadata`` of a display or result, cleaned under one budget of
    ``limit`` bytes; what did not fit is dropped, said in text/plain, and ``truncated`` set."""
    budget = Budget(limit)
    meta, meta_cut = clean_metadata(metadata, budget=budget)
    bundle, cut = clean_bundle(data, limit, budget)
    out = {"data": bundle, "metadata": meta}
    if meta_cut:
        plain = bundle.get("text/plain")
        bundle["text/plain"] = ((plain if isinstance(plain, str) else "")[: limit // 2] +
                                f"\n[sandbox: display metadata over the {limit}-byte display limit was dropped]")
    if cut or meta_cut:
        out["truncated"] = True
    return out


def _jsonable(mime: str, value, budget: Budget):
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = memoryview(value)
        budget.spend(value.nbytes * 4 // 3)
        value = bytes(value)
        if mime in BINARY_MIMES or not _is_text(value):
            return base64.b64encode(value).decode("ascii")
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return _json_clean(value, budget)


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 1000


def _short_repr(obj) -> str:
    """A repr that costs what it shows (reprlib's limits), not what the object holds."""
    try:
        return _SHORT.repr(obj)[:1000]
    except Exception as exc:  # a broken __repr__ of the cell's own object
        return f"<unrepresentable {type(obj).__name__}: {type(exc).__name__}>"


def _json_clean(obj, budget: Budget, depth: int = 0):
    """``obj`` as JSON-safe values, charged to ``budget`` before anything is copied."""
    if isinstance(obj, str):
        budget.spend(len(obj) + 2)
        return obj
    if obj is None or isinstance(obj, (bool, int)):
        budget.spend(8 + (obj.bit_length() // 3 if isinstance(obj, int) else 0))
        return obj
    if isinstance(obj, float):
        budget.spend(24)
        return obj if math.isfinite(obj) else repr(obj)
    if depth >= framecheck.MAX_DEPTH - 8:  # room for the event around it
        text = _short_repr(obj)
        budget.spend(len(text) + 2)
        return text
    if isinstance(obj, dict):
        budget.spend(2 + 4 * len(obj), containers=1, items=len(obj))
        return {_key(k, budget): _json_clean(v, budget, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        budget.spend(2 + len(obj), containers=1, items=len(obj))
        return [_json_clean(v, budget, depth + 1) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        budget.spend(len(obj) * 4 // 3 + 2)
        return base64.b64encode(bytes(obj)).decode("ascii")
    text = _short_repr(obj)
    budget.spend(len(text) + 2)
    return text


def _key(key, budget: Budget) -> str:
    text = key if isinstance(key, str) else _short_repr(key)
    budget.spend(len(text) + 2)
    return text


class EventDisplayPublisher(DisplayPublisher):
    """Sends display() output as display_data / update_display_data events."""

    runtime = None  # set by the runtime after the shell exists

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        self.runtime.publish_display(data, metadata or {}, transient or {}, update)

    def clear_output(self, wait=False):
        self.runtime.publish_clear(wait)


class EventDisplayHook(DisplayHook):
    """Sends the value of a cell's last expression as an execute_result event."""

    runtime = None

    def start_displayhook(self):
        self._bundle = None

    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        self._bundle = (format_dict, md_dict or {})

    def finish_displayhook(self):
        sys.stdout.flush()
        sys.stderr.flush()
        if self._bundle and self._bundle[0]:
            self.runtime.publish_result(self.prompt_count, *self._bundle)
        self._bundle = None
