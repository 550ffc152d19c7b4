"""What of a sandbox's widgets reaches the page (kernel/widgets.py, kernel/widget_kinds.py):
a widget is judged by all four names of its open against ipywidgets' own list, and its
state goes through its view's rules, at the open, at every update and in the control
comm's answer."""

from __future__ import annotations

import base64
import json

import pytest

from kernel import widget_kinds as K
from kernel.widgets import CommRelay

from sandbox.runtime import vocabulary as V

CONTROLS = "@jupyter-widgets/controls"
BASE = "@jupyter-widgets/base"
PAYLOAD = '<img src=x onerror="top.owned=1">'


def names(model: str, view: str | None, module: str = CONTROLS, view_module: str | None = None) -> dict:
    return {"_model_module": module, "_model_name": model, "_view_module": view_module or module, "_view_name": view}


def opened(relay: CommRelay, state: dict, comm_id: str = "c1", target: str = "jupyter.widget", buffers=None):
    return relay.to_page({"type": V.COMM_OPEN, "comm_id": comm_id, "target_name": target,
                          "data": {"state": state, "buffer_paths": [["value"]] if buffers else []},
                          "buffers": buffers or [], "metadata": {"version": "2.1.0", "other": "dropped"}})


def update(relay: CommRelay, state: dict, comm_id: str = "c1"):
    return relay.to_page({"type": V.COMM_MSG, "comm_id": comm_id, "data": {"method": "update", "state": state}})


def test_a_label_drawn_by_the_html_view_is_refused_with_a_note():
    relay = CommRelay()
    message, notes = opened(relay, {**names("LabelModel", "HTMLView"), "value": PAYLOAD})
    assert message is None
    assert len(notes) == 1 and "widget not shown" in notes[0] and "LabelModel drawn by" in notes[0]
    assert update(relay, {"value": PAYLOAD}).message is None, "its later updates go nowhere"


@pytest.mark.parametrize("state", [
    names("LabelModel", "LabelView", view_module="evil-module"),
    names("MyModel", "MyView", module="some-third-party"),
    {"_model_name": "HTMLModel"},  # names missing
])
def test_unknown_widgets_are_refused(state):
    message, notes = opened(CommRelay(), state)
    assert message is None and "widget not shown" in notes[0]


def test_an_html_widget_is_sanitized_at_the_open_and_at_every_update():
    relay = CommRelay()
    message, notes = opened(relay, {**names("HTMLModel", "HTMLView"),
                                    "value": PAYLOAD + "<table><tr><td style='x'>a &lt; b</td></tr></table>"})
    assert message.msg_type == V.COMM_OPEN and message.content["target_name"] == "jupyter.widget"
    assert message.metadata == {"version": "2.1.0"}, "the widget manager checks the protocol's version there"
    assert message.content["data"]["state"]["value"] == "<table><tbody><tr><td>a &lt; b</td></tr></tbody></table>"
    assert notes == []
    later = update(relay, {"value": "<script>x()</script><b>ok</b>"}).message
    assert later.content["data"]["state"]["value"] == "<b>ok</b>"


def test_an_update_that_renames_the_view_is_refused():
    relay = CommRelay()
    opened(relay, {**names("LabelModel", "LabelView"), "value": "hi"})
    message, notes = update(relay, {"_view_name": "HTMLView", "value": PAYLOAD})
    assert message is None and "refused" in notes[0]
    assert update(relay, {"_view_name": "LabelView", "value": "same names"}).message is not None


def test_descriptions_are_text_and_typeset_text_is_inert():
    relay = CommRelay()
    message, _ = opened(relay, {**names("IntSliderModel", "IntSliderView"), "description_allow_html": True,
                                "description": r"$\href{javascript:top.owned=2}{x}$ \style{background:url(//e)}{y}"})
    state = message.content["data"]["state"]
    assert state["description_allow_html"] is False
    assert "\\href" not in state["description"] and "\\style" not in state["description"]
    label, _ = opened(relay, {**names("HTMLMathModel", "HTMLMathView"), "value": r"$\class{x}{y}$ <b>b</b>"}, "c2")
    assert label.content["data"]["state"]["value"] == "$class{x}{y}$ <b>b</b>"


def test_media_never_fetch_an_address():
    relay = CommRelay()
    url = base64.b64encode(b"http://127.0.0.1:9/x").decode()
    message, notes = opened(relay, {**names("ImageModel", "ImageView"), "format": "url"}, buffers=[url])
    assert message.content["data"]["state"]["format"] == "png", "the address's bytes shown as a (broken) PNG"
    assert "fetch" in notes[0]
    png, notes = opened(relay, {**names("ImageModel", "ImageView"), "format": "png"}, "c2", buffers=[url])
    assert png.content["data"]["state"]["format"] == "png" and png.buffers == [b"http://127.0.0.1:9/x"] and not notes
    video, _ = opened(relay, {**names("VideoModel", "VideoView"), "format": "URL "}, "c3")
    assert video.content["data"]["state"]["format"] == "png"


@pytest.mark.parametrize("value, kept", [
    ("url(http://127.0.0.1:9/s)", False), ("URL (//e/x)", False), ("image-set('//e/x' 1x)", False),
    ("red; background: url(x)", False), ("\\75 rl(x)", False), ("@import 'x'", False),
    ("linear-gradient(red, url(x))", False),
    ("rgb(200, 0, 0)", True), ("1px solid #ccc", True), ("calc(100% - 10px)", True), ("'Helvetica Neue'", True),
])
def test_style_and_layout_keep_only_css_that_cannot_fetch(value, kept):
    relay = CommRelay()
    message, notes = opened(relay, {**names("HTMLStyleModel", "StyleView", view_module=BASE), "background": value})
    assert ("background" in message.content["data"]["state"]) is kept
    assert bool(notes) is not kept
    layout, _ = opened(relay, {**names("LayoutModel", "LayoutView", module=BASE), "border": value}, "c2")
    assert ("border" in layout.content["data"]["state"]) is kept


def test_buffers_only_where_bytes_belong():
    relay = CommRelay()
    html = base64.b64encode(PAYLOAD.encode()).decode()
    message, _ = opened(relay, {**names("HTMLModel", "HTMLView")}, buffers=[html])
    assert message.buffers == [] and message.content["data"]["buffer_paths"] == []
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "c1", "data": {}, "buffers": ["not base64!"]}).message is None


def test_an_output_widgets_outputs_go_through_the_output_policy():
    relay = CommRelay()
    outputs = [{"output_type": "display_data", "data": {"text/html": "<script>top.owned=2</script>"}, "metadata": {}},
               {"output_type": "stream", "name": "stdout", "text": "hi\n"},
               {"output_type": "javascript-ish", "data": "x"}]
    message, _ = opened(relay, {**names("OutputModel", "OutputView", module="@jupyter-widgets/output"),
                                "outputs": outputs})
    kept = message.content["data"]["state"]["outputs"]
    assert len(kept) == 2
    assert kept[0]["data"]["text/html"].startswith("<iframe") and 'sandbox="allow-scripts"' in kept[0]["data"]["text/html"]
    assert kept[1] == {"output_type": "stream", "name": "stdout", "text": "hi\n"}


def test_the_control_answer_carries_only_carried_models_under_their_recorded_names():
    relay = CommRelay()
    opened(relay, {**names("HTMLModel", "HTMLView"), "value": "<b>x</b>"}, "m1")
    opened(relay, {**names("LabelModel", "HTMLView"), "value": PAYLOAD}, "lie")  # refused at its open
    opened(relay, {**names("ImageModel", "ImageView"), "format": "png"}, "img")
    relay.from_page(V.COMM_OPEN, {"comm_id": "control", "target_name": "jupyter.widget.control"})
    states = {
        "m1": {"model_name": "HTMLModel", "model_module": CONTROLS, "state": {**names("HTMLModel", "HTMLView"),
                                                                              "value": PAYLOAD + "<b>x</b>"}},
        "lie": {"model_name": "HTMLModel", "model_module": CONTROLS, "state": {**names("HTMLModel", "HTMLView"),
                                                                               "value": PAYLOAD}},
        "img": {"model_name": "TheAnswerSaysSo", "model_module": "elsewhere",
                "state": {**names("ImageModel", "ImageView"), "format": "url"}},
    }
    buffers = [base64.b64encode(b).decode() for b in (b"lie-bytes", b"img-bytes")]
    message, _ = relay.to_page({"type": V.COMM_MSG, "comm_id": "control", "buffers": buffers, "data": {
        "method": "update_states", "states": states,
        "buffer_paths": [["lie", "state", "value"], ["img", "state", "value"]]}})
    kept = message.content["data"]["states"]
    assert set(kept) == {"m1", "img"}
    assert kept["m1"]["state"]["value"] == "<b>x</b>"
    assert (kept["img"]["model_name"], kept["img"]["model_module"]) == ("ImageModel", CONTROLS)
    assert kept["img"]["state"]["format"] == "png"
    assert message.content["data"]["buffer_paths"] == [["img", "state", "value"]] and message.buffers == [b"img-bytes"]


def test_only_widget_comms_and_the_pages_own_are_carried():
    relay = CommRelay()
    message, notes = opened(relay, names("HTMLModel", "HTMLView"), comm_id="c2", target="some.extension.target")
    assert message is None and "not carried" in notes[0]
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "never-opened", "data": {}}).message is None
    relay.from_page(V.COMM_OPEN, {"comm_id": "p1"})
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "p1", "data": {"x": 1}}).message is not None
    assert relay.to_page({"type": V.COMM_CLOSE, "comm_id": "p1", "data": {}}).message is not None
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "p1", "data": {}}).message is None, "closed"


def test_passthrough_leaves_state_as_the_sandbox_wrote_it():
    relay = CommRelay(passthrough=True)
    message, _ = opened(relay, {**names("LabelModel", "HTMLView"), "value": PAYLOAD})
    assert message.content["data"]["state"]["value"] == PAYLOAD


def test_ordinary_widgets_pass_unchanged():
    relay = CommRelay()
    state = {**names("IntSliderModel", "IntSliderView"), "value": 3, "min": 0, "max": 20, "description": "x",
             "layout": "IPY_MODEL_abc", "style": "IPY_MODEL_def"}
    message, notes = opened(relay, state)
    assert message.content["data"]["state"] == state and notes == []
    tqdm_text, _ = opened(relay, {**names("HTMLModel", "HTMLView"), "value": "100%|██████| 40/40 [00:01&lt;00:00]"},
                          "c2")
    assert tqdm_text.content["data"]["state"]["value"] == "100%|██████| 40/40 [00:01&lt;00:00]"


def test_the_allow_list_is_the_installed_ipywidgets_own():
    """The committed list is what scripts/widget_allow_list.py makes from ipywidgets of the
    same minor version (refresh it when the image's pin moves: see that script)."""
    ipywidgets = pytest.importorskip("ipywidgets")
    if ipywidgets.__version__.split(".")[:2] != K.IPYWIDGETS_VERSION.split(".")[:2]:
        pytest.skip(f"ipywidgets {ipywidgets.__version__} here, the list is of {K.IPYWIDGETS_VERSION}")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "widget_allow_list.py"
    spec = importlib.util.spec_from_file_location("widget_allow_list", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = {tuple(entry) for entry in module.allow_list()["widgets"]}
    assert made == set(K.ALLOWED), json.dumps(sorted(made ^ set(K.ALLOWED), key=str))
