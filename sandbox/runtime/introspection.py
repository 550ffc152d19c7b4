"""Completion, inspection and is-complete: the runtime's answers about code it has not run.

Each takes the shell and the request and returns the reply; the runtime sends it (trimmed
to a frame by ``Runtime.send_reply``). Kept apart from the request loop: these read the
shell's state, they never run the cell's code or touch an execution's output budget.
"""

from __future__ import annotations

from . import vocabulary as V
from .display import clean_bundle


def _cursor(message: dict) -> tuple[str, int]:
    code = message.get("code", "")
    cursor_pos = message.get("cursor_pos")
    return code, len(code) if cursor_pos is None else cursor_pos


def complete(shell, message: dict) -> dict:
    """Jedi-backed completion, as ipykernel does it (columns and methods of a DataFrame)."""
    from IPython.core.completer import provisionalcompleter, rectify_completions

    code, cursor_pos = _cursor(message)
    reply = {"type": V.REPLY, "id": message.get("id"), "matches": [],
             "cursor_start": cursor_pos, "cursor_end": cursor_pos, "metadata": {}}
    try:
        with provisionalcompleter():
            completions = list(rectify_completions(code, shell.Completer.completions(code, cursor_pos)))
    except Exception:
        completions = []
    if completions:
        reply.update(matches=[c.text for c in completions], cursor_start=completions[0].start,
                     cursor_end=completions[0].end)
        reply["metadata"] = {"_jupyter_types_experimental": [
            {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature}
            for c in completions]}
    return reply


def inspect(shell, message: dict, frame_limit: int) -> dict:
    from IPython.utils.tokenutil import token_at_cursor

    code, cursor_pos = _cursor(message)
    name = token_at_cursor(code, cursor_pos)
    reply = {"type": V.REPLY, "id": message.get("id"), "found": False, "data": {}, "metadata": {}}
    try:
        bundle = shell.object_inspect_mime(name, detail_level=int(message.get("detail_level", 0)))
        bundle.pop("text/html", None)
        reply["data"] = clean_bundle(bundle, frame_limit)[0]
        reply["found"] = True
    except Exception:
        pass
    return reply


def is_complete(shell, message: dict) -> dict:
    status, indent = shell.input_transformer_manager.check_complete(message.get("code", ""))
    reply = {"type": V.REPLY, "id": message.get("id"), "status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply
