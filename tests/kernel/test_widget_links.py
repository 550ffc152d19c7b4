"""Models that make the page copy state between widgets (kernel/widget_links.py): a link is
carried only between plain-data attributes of widgets this kernel carried, judged at the
open, at every later update or echo and in the control comm's answer; a comm id is carried
once. (The page's effect, a file PUT or a fetch, is tested in
tests/browser/test_browser_composition.py.)"""

from __future__ import annotations

import pytest

from kernel.widgets import CommRelay
from sandbox.runtime import vocabulary as V
from test_widget_policy import PAYLOAD, names, opened, update


def link_state(source: list | None, target: list | None, model: str = "LinkModel") -> dict:
    return {**names(model, None), "source": source, "target": target}


def relay_with_widgets() -> CommRelay:
    relay = CommRelay()
    for comm_id, model, view in [("text", "TextModel", "TextView"), ("slider", "IntSliderModel", "IntSliderView"),
                                 ("html", "HTMLModel", "HTMLView"), ("label", "LabelModel", "LabelView"),
                                 ("image", "ImageModel", "ImageView"), ("style", "HTMLStyleModel", "StyleView"),
                                 ("box", "CheckboxModel", "CheckboxView")]:
        state = {**names(model, view)}
        if view == "StyleView":
            state.update(_view_module="@jupyter-widgets/base")
        message, notes = opened(relay, state, comm_id)
        assert message is not None, (comm_id, notes)
    return relay


def ref(comm_id: str) -> str:
    return f"IPY_MODEL_{comm_id}"


@pytest.mark.parametrize("model", ["LinkModel", "DirectionalLinkModel"])
@pytest.mark.parametrize("source, target", [
    (["text", "value"], ["html", "value"]),  # Text value into HTML (innerHTML)
    (["text", "value"], ["label", "_view_name"]),  # 'HTMLView' into a Label's view name
    (["text", "value"], ["label", "value"]),  # typeset text
    (["text", "value"], ["style", "background"]),  # CSS
    (["text", "value"], ["image", "format"]),  # 'url': a fetch
    (["text", "value"], ["slider", "description"]),
    (["text", "value"], ["slider", "layout"]),
    (["text", "value"], ["unknown", "value"]),  # a model this kernel never carried
    (["html", "value"], ["text", "value"]),  # both ends must be plain data
])
def test_a_link_into_a_filtered_attribute_is_refused(model, source, target):
    relay = relay_with_widgets()
    state = link_state([ref(source[0]), source[1]], [ref(target[0]), target[1]], model)
    message, notes = opened(relay, state, "link")
    assert message is None and len(notes) == 1 and "was not carried" in notes[0], notes
    assert update(relay, state, "link").message is None, "a refused link's later messages go nowhere"


@pytest.mark.parametrize("source, target", [
    (["slider", "value"], ["text", "value"]),  # a slider's value into a text field
    (["box", "value"], ["box", "value"]),
    (["text", "value"], ["slider", "value"]),
])
def test_a_link_between_plain_values_passes(source, target):
    relay = relay_with_widgets()
    state = link_state([ref(source[0]), source[1]], [ref(target[0]), target[1]])
    message, notes = opened(relay, state, "link")
    assert message is not None and notes == [] and message.content["data"]["state"] == state


@pytest.mark.parametrize("method", ["update", "echo_update"])
def test_a_carried_link_cannot_be_repointed_later(method):
    relay = relay_with_widgets()
    assert opened(relay, link_state([ref("slider"), "value"], [ref("text"), "value"]), "link").message is not None
    for bad in ({"target": [ref("html"), "value"]}, {"source": [ref("label"), "_view_name"]},
                {"target": "IPY_MODEL_html"}):
        message, notes = relay.to_page({"type": V.COMM_MSG, "comm_id": "link",
                                        "data": {"method": method, "state": bad}})
        assert message is None and "was not carried" in notes[0], (bad, notes)
    fine = {"target": [ref("box"), "value"], "source": None}
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "link", "data": {"method": method, "state": fine}}).message


def test_the_control_answer_drops_a_repointed_link():
    relay = relay_with_widgets()
    opened(relay, link_state([ref("slider"), "value"], [ref("text"), "value"]), "link")
    relay.from_page(V.COMM_OPEN, {"comm_id": "control", "target_name": "jupyter.widget.control"})
    states = {"link": {"state": link_state([ref("text"), "value"], [ref("html"), "value"])},
              "text": {"state": {**names("TextModel", "TextView"), "value": PAYLOAD}}}
    message, _ = relay.to_page({"type": V.COMM_MSG, "comm_id": "control",
                                "data": {"method": "update_states", "states": states, "buffer_paths": []}})
    assert set(message.content["data"]["states"]) == {"text"}


def test_a_comm_id_is_carried_once():
    """Else a link judged against a Text could end on an HTML widget opened later under the
    same id."""
    relay = relay_with_widgets()
    relay.to_page({"type": V.COMM_CLOSE, "comm_id": "text", "data": {}})
    message, notes = opened(relay, {**names("HTMLModel", "HTMLView"), "value": "x"}, "text")
    assert message is None and "already used" in notes[0]


def test_a_controller_writes_only_into_its_own_parts():
    relay = relay_with_widgets()
    opened(relay, names("ControllerButtonModel", "ControllerButtonView"), "button")
    controller = {**names("ControllerModel", "ControllerView"), "buttons": [ref("button")], "axes": []}
    assert opened(relay, controller, "pad").message is not None
    message, notes = update(relay, {"buttons": [ref("html")]}, "pad")
    assert message is None and "ControllerButtonModel" in notes[0]
    # The page's own button models (made when a gamepad connects) come back in the echo.
    relay.from_page(V.COMM_OPEN, {"comm_id": "page-button", "target_name": "jupyter.widget",
                                  "data": {"state": names("ControllerButtonModel", "ControllerButtonView")}})
    assert update(relay, {"buttons": [ref("page-button")]}, "pad").message is not None


def test_passthrough_carries_links_as_written():
    relay = CommRelay(passthrough=True)
    state = link_state([ref("a"), "value"], [ref("b"), "_view_name"])
    assert opened(relay, state, "link").message.content["data"]["state"] == state

