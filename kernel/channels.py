"""Every channel from a sandbox to the notebook page, and the one rule for each.

Whatever the sandbox sends was written by the code in it, and JupyterLab acts on much of it
with the page's rights (the page holds the Jupyter server's token). So the kernel decides,
per channel, from what it received and never from a name the sandbox chose, what reaches
the page. `CHANNELS` is the table (docs/security.md shows the same); the rules themselves are here or
in the module each row names. A new channel gets a row and a rule before it carries a byte.

`passthrough` (`SandboxSettings.unsafe_trust_sandbox_outputs`) sets every rule aside, for
people who run only their own code; it is also the browser tests' control.
"""

from __future__ import annotations

import re
import typing as t

from sandbox.runtime import vocabulary as V

from .host import MARKER as HOST_MARKER
from .magics import MAGICS
from .output_policy import filter_bundle
from .outputs import error_content

Message = t.Tuple[str, t.Dict[str, t.Any]]


class Channel(t.NamedTuple):
    name: str
    passes: str
    refused: str
    why: str
    proven_by: str  # the hostile probe of tests/browser/test_browser_channels.py, or why it can only be harmless


CHANNELS = (
    Channel("`display_data`, `update_display_data`, `execute_result`",
            "the output table below (`output_policy`): text, checked images, active types in an isolated frame, "
            "LaTeX as MathML in a frame, widget views as a model id",
            "anything else, unknown metadata", "JupyterLab runs HTML/JS of outputs with the page's rights",
            "`test_browser_output_isolation.py` (7 payload classes, with a control); LaTeX: harmless only, "
            "JupyterLab's MathJax typesets with its Safe extension even in the control"),
    Channel("`error`, `stream`", "text (JupyterLab shows it as text, escaped)", "nothing", "shown as text",
            "HTML in both: harmless only, JupyterLab shows them as text even in the control"),
    Channel("page payload (`?`, `??`, IPython's pager)", "its bundle through the output table",
            "what the output table refuses", "JupyterLab shows it as an output",
            "a pager payload with HTML (the control's runs in the page)"),
    Channel("`set_next_input` payload",
            "text, only after a cell that runs `%load`, and only if no line of it is one the kernel runs "
            "itself (`%%host`, `%host`, the kernel's magics)",
            "anything else: shown in the cell as text instead",
            "the next Run All would run it, possibly on the host",
            "a `%%host` cell, then Run All (the control's runs on the host)"),
    Channel("`user_expressions`", "each value's bundle through the output table; errors as text",
            "what the output table refuses", "a frontend may render them",
            "asked on the page's own kernel connection, the HTML got inserted into the page as a frontend "
            "showing them would (JupyterLab never does; the control's runs in the page)"),
    Channel("`complete_reply`", "one-line matches within the current line, cursor inside the code, "
            "type/signature as short text", "matches with line breaks or that make a kernel-run line; "
            "other metadata", "an accepted completion becomes code the user runs",
            "Tab on a `%%host` match, taken and run (the control's runs on the host); HTML matches: harmless "
            "only, JupyterLab writes completion labels as text"),
    Channel("`inspect_reply`", "`text/plain` only", "every other type, metadata",
            "JupyterLab renders it in its own panels, outside any frame",
            "Shift+Tab on help with HTML (the control's tooltip fetches its image)"),
    Channel("`is_complete_reply`", "the status, an indent of spaces/tabs", "any other indent",
            "a console may insert it into the editor",
            "Shift+Enter in a console on a hostile indent: harmless only, JupyterLab 4 reads only the status"),
    Channel("`input()` prompt", "text, at most 4096 characters, and the password flag",
            "the rest of a longer prompt", "shown as text by JupyterLab",
            "HTML: harmless only, JupyterLab shows it as text even in the control"),
    Channel("comm open/msg/close (`jupyter.widget`)",
            "widgets whose model and view names are ipywidgets 8.1's own, state through their view's rules "
            "(`widget_kinds`)", "other targets and widgets, with a note in the cell; updates that rename",
            "a view chosen by the sandbox may insert HTML or CSS into the page",
            "a `Label` drawn by `HTMLView`, an `HTML` widget, an `Image` URL, a style `url()` (the control's fire)"),
    Channel("widget links (`LinkModel`, `DirectionalLinkModel`: `jslink`, `jsdlink`) and `Controller`",
            "a link whose two ends are plain-data attributes (`value` of sliders, number and text fields, checkboxes, "
            "progress bars, `Play`; `index` of selections) of widgets whose open the kernel carried; a `Controller` "
            "naming only its own button and axis models",
            "a link into or out of anything else (`_`-names, HTML or typeset values, `format`, `description*`, "
            "style or layout keys), at the open and on every later update or echo, with a note; a second open "
            "under a comm id already used",
            "the page itself copies the value after the kernel filtered both widgets",
            "`test_browser_composition.py`: a `Text` linked into an `HTML` value, `'HTMLView'` into a `Label`'s "
            "`_view_name`, `url()` into a style's `background`, `'url'` into an `Image`'s `format` (the control's "
            "run script, PUT a file, fetch); a slider linked into an `IntText` still works"),
    Channel("widget control answer (`jupyter.widget.control`)",
            "the states of models whose open was carried, under the names recorded then",
            "every other entry, and names the answer claims", "the page rebuilds widgets from it",
            "a save and a reload (the control's view lie fires again)"),
    Channel("kernel status text (progress while a sandbox is made)", "the kernel's own words, as `text/plain`",
            "nothing from the sandbox", "status comes from the kernel and server, not the sandbox",
            "none: no byte from the sandbox reaches it"),
)

PROMPT_MAX = 4096
MATCH_MAX = 500
_KERNEL_MAGIC = re.compile(r"^\s*%{1,2}(host|" + "|".join(map(re.escape, MAGICS)) + r")\b")
_LOAD = re.compile(r"^\s*%load(py)?\s", re.MULTILINE)
_INDENT = re.compile(r"[ \t]{0,80}")
_TYPE = re.compile(r"[A-Za-z_ <>]{1,32}")


def kernel_runs(text: str) -> bool:
    """Whether any line of `text` is one the kernel itself would act on (a host cell's
    marker, `%host`, the kernel's own magics) rather than send to the sandbox."""
    return any(line.strip().startswith(HOST_MARKER) or _KERNEL_MAGIC.match(line) for line in text.splitlines())


def next_input(item: dict[str, t.Any], code: str, passthrough: bool) -> tuple[dict[str, t.Any] | None, str | None]:
    """A `set_next_input` payload: (kept payload or None, note for the cell or None)."""
    text = item.get("text")
    if not isinstance(text, str):
        return None, None
    kept = {"source": "set_next_input", "text": text, "replace": bool(item.get("replace"))}
    if passthrough or (_LOAD.search(code) and not kernel_runs(text)):
        return kept, None
    return None, ("[the sandbox asked to put this text into the next cell; only %load may, and never a line "
                  f"the kernel runs itself. Shown here instead:]\n{text}\n")


def reply_payload(payloads: t.Any, code: str, passthrough: bool = False) -> tuple[list[dict[str, t.Any]], list[Message]]:
    """The execute reply's payload and the notes it owes the cell: pager text through the
    output table, `set_next_input` by `next_input`, other sources dropped."""
    kept: list[dict[str, t.Any]] = []
    notes: list[Message] = []
    for item in payloads if isinstance(payloads, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("source") == "page":
            start = item.get("start")
            kept.append({"source": "page", "data": filter_bundle(item.get("data"), {}, passthrough).data,
                         "start": start if isinstance(start, int) and not isinstance(start, bool) else 0})
        elif item.get("source") == "set_next_input":
            payload, note = next_input(item, code, passthrough)
            if payload is not None:
                kept.append(payload)
            if note is not None:
                notes.append(("stream", {"name": "stdout", "text": note}))
    return kept, notes


def reply_user_expressions(values: t.Any, passthrough: bool = False) -> dict[str, t.Any]:
    """The execute reply's user_expressions: each value's bundle through the output table,
    each error as its name, value and traceback (text)."""
    kept: dict[str, t.Any] = {}
    for name, value in (values if isinstance(values, dict) else {}).items():
        if not isinstance(value, dict):
            continue
        if value.get("status") == V.OK:
            bundle = filter_bundle(value.get("data"), value.get("metadata"), passthrough)
            kept[str(name)] = {"status": V.OK, "data": bundle.data, "metadata": bundle.metadata}
        else:
            kept[str(name)] = {"status": V.ERROR, **error_content(value.get("ename", "Error"), value.get("evalue", ""),
                                                                  value.get("traceback"))}
    return kept


def _int(value: t.Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def complete_reply(reply: t.Any, code: str, pos: int, passthrough: bool = False) -> dict[str, t.Any]:
    """A completion reply from the sandbox, as the page may insert it (see `CHANNELS`)."""
    empty = {"status": "ok", "matches": [], "cursor_start": pos, "cursor_end": pos, "metadata": {}}
    if not isinstance(reply, dict):
        return empty
    if passthrough:
        return {**empty, **reply}
    start, end = _int(reply.get("cursor_start")), _int(reply.get("cursor_end"))
    line_start = code.rfind("\n", 0, pos) + 1
    line_end = code.find("\n", pos) if "\n" in code[pos:] else len(code)
    if start is None or end is None or not (line_start <= start <= pos <= end <= line_end):
        return empty
    prefix = code[line_start:start]
    matches = [m for m in reply.get("matches") or [] if isinstance(m, str) and len(m) <= MATCH_MAX
               and m.isprintable() and not kernel_runs(prefix + m)]
    kept = {"status": "ok", "matches": matches, "cursor_start": start, "cursor_end": end, "metadata": {}}
    types = (reply.get("metadata") or {}).get("_jupyter_types_experimental") if isinstance(reply.get("metadata"), dict) else None
    if isinstance(types, list):
        described = []
        for item in types:
            if not isinstance(item, dict) or item.get("text") not in matches:
                continue
            entry = {"start": start, "end": end, "text": item["text"]}
            if isinstance(item.get("type"), str) and _TYPE.fullmatch(item["type"]):
                entry["type"] = item["type"]
            if isinstance(item.get("signature"), str) and len(item["signature"]) <= MATCH_MAX:
                entry["signature"] = item["signature"]
            described.append(entry)
        kept["metadata"] = {"_jupyter_types_experimental": described}
    return kept


def inspect_reply(reply: t.Any, passthrough: bool = False) -> dict[str, t.Any]:
    """Help text from the sandbox: its plain text only."""
    if not isinstance(reply, dict):
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}
    if passthrough:
        return {"status": "ok", "found": bool(reply.get("found")), "data": reply.get("data") or {},
                "metadata": reply.get("metadata") or {}}
    data = reply.get("data") if isinstance(reply.get("data"), dict) else {}
    plain = data.get("text/plain")
    return {"status": "ok", "found": bool(reply.get("found")),
            "data": {"text/plain": plain} if isinstance(plain, str) else {}, "metadata": {}}


def is_complete_reply(reply: t.Any) -> dict[str, t.Any] | None:
    """The sandbox's answer to is_complete, or None if it is not one."""
    if not isinstance(reply, dict) or reply.get("status") not in ("complete", "incomplete", "invalid", "unknown"):
        return None
    result = {"status": reply["status"]}
    if reply["status"] == "incomplete":
        indent = reply.get("indent", "")
        result["indent"] = indent if isinstance(indent, str) and _INDENT.fullmatch(indent) else ""
    return result


def input_prompt(event: dict[str, t.Any]) -> tuple[str, bool]:
    """An input() question from the sandbox: its prompt (text, capped) and password flag."""
    return str(event.get("prompt", ""))[:PROMPT_MAX], bool(event.get("password"))
