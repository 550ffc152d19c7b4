"""Comms between the notebook page and the sandbox (ipywidgets), and what of them may reach
the page.

A widget is a model whose state the sandbox writes and JupyterLab's widget manager renders
with widget code already installed in JupyterLab (the manager loads no code from a kernel).
But the sandbox chooses which installed view draws the state, and a few views put parts of
it into the page as HTML or CSS, in the page's origin, outside any frame. So, before a
message leaves the kernel (the channel rules are listed in `channels`):

- only comms the sandbox opens to the ``jupyter.widget`` target, and comms the page opened
  itself, are carried; another target's comm is refused with a note in the cell;
- a widget is judged by the four names of its ``comm_open`` (model module and name, view
  module and name) against the allow-list of `widget_kinds`; one not in it is refused with a
  note in the cell, never shown; a later update that changes any of the four is refused;
- its state, at the open and at every update, goes through its view's rules
  (`widget_kinds`: HTML sanitized, descriptions as text, inert TeX, no fetching media or CSS);
- a model that makes the page copy state between widgets (links, the gamepad controller) is
  judged by what the page will write where (`widget_links`), at the open and at every update;
- a comm id is carried once: a later open under an id already used is refused, so a link's
  end always names the model that was judged;
- an ``Output`` widget's ``outputs`` go through the output policy, like any output;
- the control comm's answer (``update_states``, every model's state, after a page reload)
  carries only models whose open this kernel carried, under the names recorded then, with
  the same state rules: never the names the answer claims.
"""

from __future__ import annotations

import base64
import binascii
import typing as t

from sandbox.runtime import vocabulary as V

from . import widget_kinds as K
from . import widget_links as L
from .frames import sanitized_html
from .output_policy import filter_bundle

WIDGET_TARGET = "jupyter.widget"
PAGE_OPENED = "(opened by the page)"
STATE_METHODS = ("update", "echo_update")


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


def safe_state(spec: K.Spec, state: dict[str, t.Any], notes: list[str]) -> dict[str, t.Any]:
    """A widget's state as its view may show it in the page (see `widget_kinds`); what was
    changed is said in `notes`."""
    view = spec[3]
    state = dict(state)
    if "description_allow_html" in state:
        state["description_allow_html"] = False
    if isinstance(state.get("description"), str):
        state["description"] = K.plain_tex(state["description"])
    if isinstance(state.get("value"), str):
        if view in K.HTML_VIEWS:
            state["value"] = sanitized_html(state["value"])
        if view in K.TYPESET_VIEWS:
            state["value"] = K.plain_tex(state["value"])
    if view in K.MEDIA_VIEWS and "format" in state and not K.media_format(state["format"]):
        notes.append(f"[a {spec[1]} with format={state['format']!r} was not shown as such: the browser would "
                     "fetch an address chosen by the sandbox (widgets show bytes only)]\n")
        state["format"] = "png"
    if view in K.CSS_VIEWS:
        for key in [k for k, v in state.items() if not k.startswith("_") and not K.css_value(v)]:
            notes.append(f"[a widget's {key}={state[key]!r} was dropped: style that could fetch or run is not "
                         "carried to the page]\n")
            del state[key]
    if view == K.OUTPUT_VIEW and "outputs" in state:
        outputs = state["outputs"] if isinstance(state["outputs"], list) else []
        state["outputs"] = [kept for kept in (safe_output(o) for o in outputs) if kept is not None]
    return state


def names_changed(spec: K.Spec, state: dict[str, t.Any]) -> bool:
    """Whether a state sets any of the four names to something other than the open's."""
    return any(key in state and state[key] != name for key, name in zip(K.NAME_KEYS, spec))


def kept_buffers(paths: t.Any, buffers: list[bytes], allowed: t.Callable[[list], bool]) -> tuple[list, list[bytes]]:
    """The (path, buffer) pairs whose path `allowed` accepts, still aligned."""
    pairs = zip(paths if isinstance(paths, list) else [], buffers)
    kept = [(path, buf) for path, buf in pairs if isinstance(path, list) and path and allowed(path)]
    return [p for p, _ in kept], [b for _, b in kept]


def refused_note(spec: K.Spec) -> str:
    return (f"[widget not shown: {K.describe(spec)} is not one of the widgets of ipywidgets "
            f"{K.IPYWIDGETS_VERSION}, the only ones the kernel lets reach the page]\n")


class CommMessage(t.NamedTuple):
    msg_type: str
    content: dict[str, t.Any]
    buffers: list[bytes]
    metadata: dict[str, t.Any]


class Relayed(t.NamedTuple):
    """What a comm event from the sandbox becomes: the message for the page (None: refused)
    and notes for the cell, saying what was refused or changed."""

    message: CommMessage | None
    notes: list[str]


class CommRelay:
    """The comms this kernel carries between the page and the sandbox, and their models."""

    def __init__(self, passthrough: bool = False) -> None:
        self.passthrough = passthrough
        self.models: dict[str, K.Spec | str] = {}  # comm id -> the four names of its open (or PAGE_OPENED)
        self.page_models: dict[str, K.Spec] = {}  # widgets the page opened itself -> their four names
        self.used: set[str] = set()  # every comm id ever opened, from either side

    def carried(self, model_id: str) -> K.Spec | None:
        """The four names of a live widget model: one whose open this kernel carried, or
        one the page opened itself."""
        spec = self.models.get(model_id)
        return spec if isinstance(spec, tuple) else self.page_models.get(model_id)

    def from_page(self, msg_type: str, content: dict[str, t.Any]) -> None:
        """Record a comm the page opens or closes (the widget manager's control comm)."""
        comm_id = str(content.get("comm_id", ""))
        if msg_type == V.COMM_OPEN:
            self.models[comm_id] = PAGE_OPENED
            self.used.add(comm_id)
            data = content.get("data") if isinstance(content.get("data"), dict) else {}
            if content.get("target_name") == WIDGET_TARGET and isinstance(data.get("state"), dict):
                self.page_models[comm_id] = K.spec_of(data["state"])
        elif msg_type == V.COMM_CLOSE:
            self.models.pop(comm_id, None)
            self.page_models.pop(comm_id, None)

    def to_page(self, event: dict[str, t.Any]) -> Relayed:
        """The IOPub message for a comm event from the sandbox, and notes for the cell."""
        kind = event.get("type")
        comm_id = str(event.get("comm_id", ""))
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        notes: list[str] = []
        buffers = []
        for item in event.get("buffers") or []:
            try:
                buffers.append(base64.b64decode(item, validate=True))
            except (binascii.Error, ValueError, TypeError):
                return Relayed(None, [])
        if kind == V.COMM_OPEN:
            if event.get("target_name") != WIDGET_TARGET:
                return Relayed(None, [f"[a comm to {str(event.get('target_name'))[:80]!r} from the sandbox was not "
                                      "carried: only ipywidgets' comms reach the page]\n"])
            state = data.get("state") if isinstance(data.get("state"), dict) else {}
            spec = K.spec_of(state)
            if not self.passthrough and not K.allowed(spec):
                return Relayed(None, [refused_note(spec)])
            if not self.passthrough and comm_id in self.used:
                return Relayed(None, [f"[a widget opened under a comm id already used ({comm_id[:40]!r}) was not "
                                      "carried]\n"])
            self.models[comm_id] = spec
            self.used.add(comm_id)
        elif kind not in V.COMM_MESSAGES or comm_id not in self.models:
            return Relayed(None, [])
        if not self.passthrough:
            checked = self.safe_data(self.models[comm_id], data, buffers, notes)
            if checked is None:
                if kind == V.COMM_OPEN:
                    self.models.pop(comm_id, None)  # never reached the page: its later messages neither
                return Relayed(None, notes)
            data, buffers = checked
        content: dict[str, t.Any] = {"comm_id": comm_id, "data": data}
        if kind == V.COMM_OPEN:
            content["target_name"] = WIDGET_TARGET
            if isinstance(event.get("target_module"), str):
                content["target_module"] = event["target_module"]
        if kind == V.COMM_CLOSE:
            self.models.pop(comm_id, None)
        metadata = event.get("metadata") if isinstance(event.get("metadata"), dict) else {}
        # The widget manager reads the protocol's version from the message's metadata.
        version = {"version": metadata["version"]} if isinstance(metadata.get("version"), str) else {}
        return Relayed(CommMessage(str(kind), content, buffers, version), notes)

    def safe_data(self, spec: K.Spec | str, data: dict[str, t.Any], buffers: list[bytes],
                  notes: list[str]) -> tuple[dict[str, t.Any], list[bytes]] | None:
        """A message's data and buffers as they may reach the page; None: refused."""
        data = dict(data)
        if spec == PAGE_OPENED:  # the control comm: its answer holds every model's state
            return self.control_answer(data, buffers, notes)
        assert not isinstance(spec, str)
        if isinstance(data.get("state"), dict):
            if names_changed(spec, data["state"]):
                notes.append(f"[a widget update that would draw {K.describe(spec)} differently was refused]\n")
                return None
            why = L.refusal(spec, data["state"], self.carried)
            if why:
                notes.append(f"[{why}]\n")
                return None
            data["state"] = safe_state(spec, data["state"], notes)
        paths, buffers = kept_buffers(data.get("buffer_paths"), buffers, lambda p: K.binary_key(spec, p[0]))
        if "buffer_paths" in data:
            data["buffer_paths"] = paths
        return data, buffers

    def control_answer(self, data: dict[str, t.Any], buffers: list[bytes],
                       notes: list[str]) -> tuple[dict[str, t.Any], list[bytes]]:
        """``update_states``: only the models whose open was carried, under the recorded names."""
        if not isinstance(data.get("states"), dict):
            return data, []
        kept: dict[str, t.Any] = {}
        for model_id, entry in data["states"].items():
            spec = self.models.get(model_id)
            state = entry.get("state") if isinstance(entry, dict) else None
            if not isinstance(spec, tuple) or not isinstance(state, dict) or names_changed(spec, state) \
                    or L.refusal(spec, state, self.carried):
                continue
            version = entry.get("model_module_version")
            kept[model_id] = {"model_module": spec[0], "model_name": spec[1],
                              "model_module_version": version if isinstance(version, str) else "",
                              "state": safe_state(spec, state, [])}

        def allowed(path: list) -> bool:
            spec = self.models.get(path[0]) if path[0] in kept else None
            return isinstance(spec, tuple) and len(path) > 2 and path[1] == "state" and K.binary_key(spec, path[2])

        data["states"] = kept
        data["buffer_paths"], buffers = kept_buffers(data.get("buffer_paths"), buffers, allowed)
        return data, buffers
