"""Comms between the notebook page and the sandbox (ipywidgets), and what of them may reach
the page.

A widget is a model whose state the sandbox writes and JupyterLab's widget manager renders
with widget code already installed in JupyterLab (the manager loads no code of its own from
a kernel: a model naming a module JupyterLab does not have is not shown). So widget state is
data; but a few of the core widgets put parts of it into the page as HTML, in the page's
origin, outside any frame. Those parts are made plain here, before a message leaves the
kernel, the same trust rule as for outputs (`output_policy`):

- the ``value`` of ``HTML`` and ``HTMLMath`` widgets is reduced to its text (escaped), so
  ``<img onerror=…>`` shows as nothing but text;
- ``description_allow_html`` is always false (descriptions are shown as text);
- an ``Output`` widget's ``outputs`` go through the output policy, like any output;
- only comms the sandbox opens to the ``jupyter.widget`` target, and comms the page opened
  itself, are carried; messages of any other comm are dropped.

The model names are tracked per comm, from its ``comm_open`` (a later update does not
repeat them).
"""

from __future__ import annotations

import base64
import binascii
import html
import typing as t
from html.parser import HTMLParser

from sandbox.runtime import vocabulary as V

from .output_policy import filter_bundle

WIDGET_TARGET = "jupyter.widget"
HTML_VALUE_MODELS = frozenset({"HTMLModel", "HTMLMathModel"})
OUTPUT_MODEL = "OutputModel"
PAGE_OPENED = "(opened by the page)"


class _TextOnly(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def html_as_text(value: str) -> str:
    """HTML reduced to its text, escaped again: what it says, with no markup."""
    parser = _TextOnly()
    parser.feed(value)
    parser.close()
    return html.escape("".join(parser.parts), quote=False)


def safe_output(output: t.Any, passthrough: bool = False) -> dict[str, t.Any] | None:
    """One entry of an Output widget's ``outputs``, as the output policy lets it through."""
    if not isinstance(output, dict):
        return None
    kind = output.get("output_type")
    if kind in (V.DISPLAY_DATA, V.EXECUTE_RESULT):
        bundle = filter_bundle(output.get("data"), output.get("metadata"), passthrough)
        kept = {"output_type": kind, "data": bundle.data, "metadata": bundle.metadata}
        if kind == V.EXECUTE_RESULT:
            count = output.get("execution_count")
            kept["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
        return kept
    if kind == V.STREAM:
        return {"output_type": "stream", "name": "stderr" if output.get("name") == "stderr" else "stdout",
                "text": str(output.get("text", ""))}
    if kind == V.ERROR:
        return {"output_type": "error", "ename": str(output.get("ename", "")), "evalue": str(output.get("evalue", "")),
                "traceback": [str(line) for line in output.get("traceback") or []]}
    return None


def safe_state(model: str, state: dict[str, t.Any], passthrough: bool = False) -> dict[str, t.Any]:
    """A widget model's state with its HTML sinks made plain (see the module's docstring)."""
    if passthrough:
        return state
    state = dict(state)
    if "description_allow_html" in state:
        state["description_allow_html"] = False
    if model in HTML_VALUE_MODELS and isinstance(state.get("value"), str):
        state["value"] = html_as_text(state["value"])
    if model == OUTPUT_MODEL and "outputs" in state:
        outputs = state["outputs"] if isinstance(state["outputs"], list) else []
        state["outputs"] = [kept for kept in (safe_output(o) for o in outputs) if kept is not None]
    return state


class CommMessage(t.NamedTuple):
    msg_type: str
    content: dict[str, t.Any]
    buffers: list[bytes]
    metadata: dict[str, t.Any]


class CommRelay:
    """The comms this kernel carries between the page and the sandbox, and their models."""

    def __init__(self, passthrough: bool = False) -> None:
        self.passthrough = passthrough
        self.models: dict[str, str] = {}  # comm id -> the model it holds (or PAGE_OPENED)

    def from_page(self, msg_type: str, content: dict[str, t.Any]) -> None:
        """Record a comm the page opens or closes (the widget manager's control comm)."""
        comm_id = str(content.get("comm_id", ""))
        if msg_type == V.COMM_OPEN:
            self.models[comm_id] = PAGE_OPENED
        elif msg_type == V.COMM_CLOSE:
            self.models.pop(comm_id, None)

    def to_page(self, event: dict[str, t.Any]) -> CommMessage | None:
        """The IOPub message for a comm event from the sandbox, or None if it may not reach
        the page."""
        kind = event.get("type")
        comm_id = str(event.get("comm_id", ""))
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        if kind == V.COMM_OPEN:
            if event.get("target_name") != WIDGET_TARGET:
                return None
            state = data.get("state") if isinstance(data.get("state"), dict) else {}
            self.models[comm_id] = str(state.get("_model_name", ""))
        elif kind not in V.COMM_MESSAGES or comm_id not in self.models:
            return None
        content: dict[str, t.Any] = {"comm_id": comm_id, "data": self.safe_data(comm_id, data)}
        if kind == V.COMM_OPEN:
            content["target_name"] = WIDGET_TARGET
            if isinstance(event.get("target_module"), str):
                content["target_module"] = event["target_module"]
        if kind == V.COMM_CLOSE:
            self.models.pop(comm_id, None)
        buffers = []
        for item in event.get("buffers") or []:
            try:
                buffers.append(base64.b64decode(item, validate=True))
            except (binascii.Error, ValueError, TypeError):
                return None
        metadata = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
        # The widget manager reads the protocol's version from the message's metadata.
        version = {"version": metadata["version"]} if isinstance(metadata.get("version"), str) else {}
        return CommMessage(str(kind), content, buffers, version)

    def safe_data(self, comm_id: str, data: dict[str, t.Any]) -> dict[str, t.Any]:
        data = dict(data)
        if isinstance(data.get("state"), dict):
            data["state"] = safe_state(self.models.get(comm_id, ""), data["state"], self.passthrough)
        if isinstance(data.get("states"), dict):  # the control comm's answer: every model's state
            data["states"] = {
                model_id: {**entry, "state": safe_state(str(entry.get("model_name", "")),
                                                        entry.get("state") if isinstance(entry.get("state"), dict)
                                                        else {}, self.passthrough)}
                for model_id, entry in data["states"].items() if isinstance(entry, dict)}
        return data
