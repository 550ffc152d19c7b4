"""Which of a sandbox's rich outputs reach the notebook page, and how: the kernel is the
trust boundary for outputs.

A display bundle from the sandbox (`data` by MIME type, plus `metadata`) was written by the
code in the sandbox. JupyterLab trusts every output of the session: its HTML runs scripts
with the page's origin, which holds the server's token, so an unfiltered bundle is a way
out of the sandbox onto the host (a terminal, the contents API). So each MIME type gets
one decision, the table below (docs/security.md shows the same table):

- passive types pass, checked to be what they claim: text, and PNG/JPEG/GIF whose bytes
  are valid base64 of a file with the right magic number;
- active types (HTML, JavaScript, SVG, Markdown) are shown in an isolated frame
  (`kernel/frames.py`): scripts run there, with no access to the page or the server;
  LaTeX too, converted to MathML in the kernel (`kernel/mathml.py`), never typeset by the
  page's MathJax; its source stays in the bundle beside that `text/html` (which every
  frontend that has it prefers) for nbconvert's LaTeX and PDF exports;
- a widget view (`application/vnd.jupyter.widget-view+json`) passes as a model id and
  version numbers only: JupyterLab then renders that model with widget code it has
  installed, from state the kernel filtered (`kernel/widgets.py`);
- everything else (any other `application/vnd.*`, JSON, unknown types) never
  reaches the page; if nothing else is left, a plain note says what was withheld;
- metadata is rebuilt from an allow-list (an image's width and height as numbers, its
  `needs_background`), so a sandbox can never set `trusted`, `isolated` or any other key a
  frontend acts on;
- `text/plain` is never changed, so notebooks recorded before keep validating.

The one exception is `passthrough` (see `SandboxSettings.unsafe_trust_sandbox_outputs`),
for people who run only their own code and want outputs exactly as IPython made them.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import typing as t
from dataclasses import dataclass, field

from .frames import BUILDERS, framed_html

PASS = "pass"
CHECK_IMAGE = "pass if its bytes are a valid image of that type, else a note"
FRAME = "isolated frame"
WITHHOLD = "withheld"
WIDGET_VIEW = "pass as a model id and version numbers"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
LATEX = "text/latex"

# Magic numbers of the passive image types.
IMAGE_MAGIC: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
}

# One decision per type. For framed types the order is JupyterLab's order of preference:
# the first present is the one framed (the frontend would have shown that one).
POLICY: dict[str, str] = {
    "text/plain": PASS,
    **{mime: CHECK_IMAGE for mime in IMAGE_MAGIC},
    **{mime: FRAME for mime in BUILDERS},  # text/latex among them: converted to MathML first
    WIDGET_VIEW_MIME: WIDGET_VIEW,
    "application/json": WITHHOLD,
}
DEFAULT = WITHHOLD  # any other type, application/vnd.* included

# Metadata a frontend may act on, per key, with the values accepted; everything else goes.
_SIZE_KEYS = ("width", "height")
_BACKGROUNDS = ("light", "dark")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_MODEL_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")


@dataclass
class Filtered:
    """A bundle as it may reach the page, and notes on what was refused."""

    data: dict[str, t.Any]
    metadata: dict[str, t.Any]
    notes: list[str] = field(default_factory=list)


def decision(mime: str) -> str:
    return POLICY.get(mime, DEFAULT)


def image_problem(mime: str, value: t.Any) -> str | None:
    """Why `value` is not a valid base64 `mime` image, or None if it is."""
    if not isinstance(value, str):
        return "it is not base64 text"
    compact = "".join(value.split())
    if not compact or len(compact) % 4 or not _BASE64.fullmatch(compact):
        return "it is not valid base64"
    try:
        head = base64.b64decode(compact[:64], validate=True)
    except (binascii.Error, ValueError):
        return "it is not valid base64"
    if not head.startswith(IMAGE_MAGIC[mime]):
        return f"its bytes are not a {mime.split('/')[1].upper()} image"
    return None


def widget_view(value: t.Any) -> dict[str, t.Any] | None:
    """A widget view reduced to what names its model, or None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("model_id"), str):
        return None
    if not _MODEL_ID.fullmatch(value["model_id"]):
        return None
    view = {"model_id": value["model_id"]}
    for key in ("version_major", "version_minor"):
        number = value.get(key)
        if isinstance(number, int) and not isinstance(number, bool):
            view[key] = number
    return view


def _number(value: t.Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def image_metadata(meta: t.Any) -> dict[str, t.Any]:
    """The allow-listed part of one image's metadata."""
    if not isinstance(meta, dict):
        return {}
    kept: dict[str, t.Any] = {k: meta[k] for k in _SIZE_KEYS if _number(meta.get(k))}
    if meta.get("needs_background") in _BACKGROUNDS:
        kept["needs_background"] = meta["needs_background"]
    return kept


def filter_bundle(data: t.Any, metadata: t.Any, passthrough: bool = False) -> Filtered:
    """Apply `POLICY` to one display bundle."""
    data = dict(data) if isinstance(data, dict) else {}
    metadata = dict(metadata) if isinstance(metadata, dict) else {}
    if passthrough:
        return Filtered(data, metadata)
    kept: dict[str, t.Any] = {}
    meta: dict[str, t.Any] = {}
    notes: list[str] = []
    withheld: list[str] = []
    framed: str | None = None
    for mime, value in data.items():
        rule = decision(mime)
        if rule == PASS:
            if isinstance(value, str):
                kept[mime] = value
            else:
                withheld.append(mime)
        elif rule == CHECK_IMAGE:
            problem = image_problem(mime, value)
            if problem is None:
                kept[mime] = value
                image_meta = image_metadata(metadata.get(mime))
                if image_meta:
                    meta[mime] = image_meta
            else:
                notes.append(f"an {mime} output was not shown: {problem}")
        elif rule == FRAME and isinstance(value, str):
            pass  # chosen below, in the frontend's order
        elif rule == WIDGET_VIEW and widget_view(value) is not None:
            kept[mime] = widget_view(value)
        else:
            withheld.append(mime)
    for mime in BUILDERS:
        if isinstance(data.get(mime), str):
            framed = mime
            break
    if framed is not None:
        kept["text/html"] = framed_html(framed, data[framed])
        if isinstance(data.get(LATEX), str):
            # Kept for what reads the saved notebook (nbconvert to LaTeX and PDF, other
            # tools), never for the page: JupyterLab shows `text/html` first whenever a
            # bundle has it, trusted or not, so its MathJax never typesets this source.
            kept[LATEX] = data[LATEX]
    if not kept:
        refused = withheld + [m for m in data if decision(m) == CHECK_IMAGE]
        kept["text/plain"] = f"[output not shown: {', '.join(refused) or 'empty'} from the sandbox cannot be shown safely]"
    return Filtered(kept, meta, notes)


def filter_transient(transient: t.Any) -> dict[str, t.Any]:
    """Only the display id (a string) is kept: it is all a frontend uses."""
    if isinstance(transient, dict) and isinstance(transient.get("display_id"), str):
        return {"display_id": transient["display_id"]}
    return {}
