"""IPython display plumbing that turns rich output into events instead of terminal text.

These mirror ipykernel's ZMQDisplayPublisher and ZMQShellDisplayHook: the shell formats
objects into MIME bundles exactly as it does under Jupyter, and we forward the bundles.
"""

from __future__ import annotations

import base64
import json
import math
import sys

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher

from . import framecheck
from .vocabulary import is_json_mime

BINARY_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")


def clean_bundle(data: dict, limit: int) -> tuple[dict, bool]:
    """Make a MIME bundle JSON-safe and within ``limit`` bytes; say whether it was cut."""
    out: dict = {}
    size = 0
    cut = False
    for mime, value in (data or {}).items():
        mime = str(mime)
        value = _jsonable(mime, value)
        if not isinstance(value, str) and not is_json_mime(mime):
            value = json.dumps(value)  # a bundle maps every non-JSON MIME type to text
        n = len(value) if isinstance(value, str) else len(repr(value))
        if size + n > limit and mime != "text/plain":
            cut = True
            continue
        size += n
        out[mime] = value
    if cut:
        note = f"\n[sandbox: a rich representation over the {limit // (1024 * 1024)} MiB display limit was dropped]"
        out["text/plain"] = str(out.get("text/plain", ""))[: limit // 2] + note
    return out, cut


def clean_metadata(metadata) -> dict:
    """Display metadata (or transient) made JSON-safe: an object, nested no deeper than a
    frame may be (what is deeper is shown as its repr)."""
    if not isinstance(metadata, dict):
        return {}
    return _json_clean(metadata)


def _jsonable(mime: str, value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)
        if mime in BINARY_MIMES or not _is_text(value):
            return base64.b64encode(value).decode("ascii")
        return value.decode("utf-8", "replace")
    return _json_clean(value)


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _json_clean(obj, depth: int = 0):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else repr(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if depth >= framecheck.MAX_DEPTH - 8:  # room for the event around it
        return repr(obj)[:1000]
    if isinstance(obj, dict):
        return {str(k): _json_clean(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_json_clean(v, depth + 1) for v in obj]
    if isinstance(obj, (bytes, bytearray)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    return repr(obj)


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
