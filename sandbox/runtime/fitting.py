"""Make every event the runtime sends fit: within the execute's output budget and a valid frame.

The sandbox pays for its own output: an oversized exception, display or result is trimmed
here, in the sandbox, before it is framed, instead of being sent whole for the host to
refuse (``raise ValueError('q' * 30_000_000)`` used to make a 60 MB frame that stopped the
sandbox and lost its variables). Every output event (streams, displays and their metadata,
results, errors and tracebacks) is charged what its frame costs (``framecheck.frame_cost``,
the same count the supervisor keeps); past the budget, what is left is cut or replaced and
marked ``truncated``. The same structural checks the supervisor makes (``framecheck``) are
run here first, so a frame this runtime sends is never one its supervisor refuses.
"""

from __future__ import annotations

import json

from . import framecheck
from . import vocabulary as V

TEXT_CUT = 64 * 1024  # an exception's value or a traceback line is cut to this many characters
NOTE = "\n[sandbox: output truncated: {what}]"


def payload(message: dict) -> bytes:
    """The frame payload the channel would send for ``message``."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def problem(data: bytes, limit: int) -> str | None:
    """Why ``data`` would be refused as a frame (too large, too many items, too deep), or None."""
    if len(data) > limit:
        return f"{len(data)} bytes, over the {limit}-byte frame limit"
    try:
        framecheck.scan(data)
    except framecheck.Violation as exc:
        return str(exc)
    return None


def _json_len(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "replace"))


def cut_text(text: str, room: int, what: str = "text") -> str:
    """``text`` cut so that its JSON form takes at most about ``room`` bytes, with a note."""
    if len(text) * 6 + 2 <= room:  # fits however it is escaped
        return text
    size = _json_len(text)
    if size <= room:
        return text
    keep = max(0, room * len(text) // size - 160)
    while keep > 0 and _json_len(text[:keep]) > room - 160:
        keep = keep * 3 // 4
    return text[:keep] + NOTE.format(what=f"{len(text) - keep} of {len(text)} characters of {what} cut")


def shrink(message: dict, room: int) -> dict | None:
    """A smaller form of ``message`` whose frame takes at most about ``room`` bytes, or None
    if nothing useful fits. The result says ``truncated: true``."""
    kind = message.get("type")
    out = dict(message)
    envelope = 512
    text_room = max(0, room - envelope)
    if kind == V.STREAM:
        if text_room < 64:
            return None
        # Cut without a note of its own: the execute's truncation notice counts what was dropped.
        text = message["text"]
        keep = len(text)
        while keep and len(json.dumps(text[:keep], ensure_ascii=False).encode("utf-8", "replace")) > text_room:
            keep = keep * text_room // len(json.dumps(text[:keep], ensure_ascii=False).encode("utf-8", "replace")) - 1
        out["text"] = text[:max(0, keep)]
    elif kind == V.ERROR:
        # The error always says what it was: its name, and as much of its value as fits.
        value_room = min(TEXT_CUT, max(256, text_room // 4))
        out["evalue"] = cut_text(str(message.get("evalue", "")), value_room, "the exception's value")
        lines = [cut_text(line, min(TEXT_CUT, max(256, text_room // 4)), "a traceback line")
                 for line in message.get("traceback") or []]
        budget, kept = max(512, text_room - value_room), []
        for line in reversed(lines):  # the end of a traceback says what happened
            size = len(line.encode("utf-8", "replace")) * 2 + 8
            if size > budget:
                kept.append(NOTE.format(what=f"{len(lines) - len(kept)} earlier traceback lines cut").lstrip("\n"))
                break
            budget -= size
            kept.append(line)
        out["traceback"] = list(reversed(kept))
    elif kind in V.BUNDLE_EVENTS:
        data = message.get("data") or {}
        plain = data.get("text/plain")
        plain = plain if isinstance(plain, str) else ""
        dropped = sorted(k for k in data if k != "text/plain")
        note = f"{', '.join(dropped)[:200]} dropped" if dropped else "the text was cut"
        if text_room < 256:
            return None
        out["data"] = {"text/plain": cut_text(plain, text_room // 2, "text/plain") + NOTE.format(what=note)}
        out["metadata"] = {}
        if "transient" in out and problem(payload({"t": out["transient"]}), 4096):
            out["transient"] = {}
    elif kind == V.REPLY:
        if "matches" in out:
            out["matches"] = out["matches"][:1000]
            out["metadata"] = {}
        if "data" in out:
            plain = (out.get("data") or {}).get("text/plain")
            out["data"] = {"text/plain": cut_text(plain if isinstance(plain, str) else "", text_room // 2, "help text")}
            out["metadata"] = {}
        return out
    else:
        return None
    out["truncated"] = True
    return out


def fit(message: dict, room: int, limit: int) -> tuple[dict | None, bytes | None]:
    """``message`` (or its trimmed form) and its payload, fitting ``room`` bytes of budget and
    the frame ``limit``; (None, None) if nothing fits."""
    data = payload(message)
    if framecheck.frame_cost(len(data)) <= room and problem(data, limit) is None:
        return message, data
    smaller = shrink(message, min(room, limit) - framecheck.FRAME_OVERHEAD)
    if smaller is None:
        return None, None
    data = payload(smaller)
    if framecheck.frame_cost(len(data)) <= room and problem(data, limit) is None:
        return smaller, data
    return None, None
