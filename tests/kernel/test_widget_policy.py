"""What of a sandbox's widgets reaches the page (kernel/widgets.py): widget state is data,
and the core widgets' HTML sinks are made plain before a message leaves the kernel."""

from __future__ import annotations

import base64

from kernel.widgets import CommRelay, html_as_text

from sandbox.runtime import vocabulary as V


def opened(relay: CommRelay, model: str, state: dict, comm_id: str = "c1", target: str = "jupyter.widget"):
    return relay.to_page({"type": V.COMM_OPEN, "comm_id": comm_id, "target_name": target,
                          "data": {"state": {"_model_name": model, **state}, "buffer_paths": []},
                          "metadata": {"version": "2.1.0", "other": "dropped"}})


def test_an_html_widget_shows_text_only():
    relay = CommRelay()
    kind, content, _, metadata = opened(relay, "HTMLModel",
                                        {"value": '<img src=x onerror="top.owned=1">a &lt; b <b>c</b>'})
    assert kind == V.COMM_OPEN and content["target_name"] == "jupyter.widget"
    assert metadata == {"version": "2.1.0"}, "the widget manager checks the protocol's version there"
    assert content["data"]["state"]["value"] == "a &lt; b c"
    # ... and so do its later updates, known by the comm's model
    _, update, _, _ = relay.to_page({"type": V.COMM_MSG, "comm_id": "c1",
                                  "data": {"method": "update", "state": {"value": "<script>x()</script>ok"}}})
    assert update["data"]["state"]["value"] == "x()ok"


def test_descriptions_never_render_as_html():
    relay = CommRelay()
    _, content, _, _ = opened(relay, "IntSliderModel", {"description": "<img src=x onerror=y()>",
                                                      "description_allow_html": True})
    assert content["data"]["state"]["description_allow_html"] is False


def test_an_output_widgets_outputs_go_through_the_output_policy():
    relay = CommRelay()
    outputs = [{"output_type": "display_data", "data": {"text/html": "<script>top.owned=2</script>"}, "metadata": {}},
               {"output_type": "stream", "name": "stdout", "text": "hi\n"},
               {"output_type": "javascript-ish", "data": "x"}]
    _, content, _, _ = opened(relay, "OutputModel", {"outputs": outputs})
    kept = content["data"]["state"]["outputs"]
    assert len(kept) == 2
    assert kept[0]["data"]["text/html"].startswith("<iframe") and 'sandbox="allow-scripts"' in kept[0]["data"]["text/html"]
    assert kept[1] == {"output_type": "stream", "name": "stdout", "text": "hi\n"}


def test_the_control_comms_state_answer_is_filtered_too():
    relay = CommRelay()
    relay.from_page(V.COMM_OPEN, {"comm_id": "control", "target_name": "jupyter.widget.control"})
    _, content, _, _ = relay.to_page({"type": V.COMM_MSG, "comm_id": "control", "data": {
        "method": "update_states", "states": {"m1": {"model_name": "HTMLModel", "state": {"value": "<b>x</b>"}}}}})
    assert content["data"]["states"]["m1"]["state"]["value"] == "x"


def test_only_widget_comms_and_the_pages_own_are_carried():
    relay = CommRelay()
    assert opened(relay, "AnyModel", {}, comm_id="c2", target="some.extension.target") is None
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "never-opened", "data": {}}) is None
    relay.from_page(V.COMM_OPEN, {"comm_id": "p1"})
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "p1", "data": {"x": 1}}) is not None
    assert relay.to_page({"type": V.COMM_CLOSE, "comm_id": "p1", "data": {}}) is not None
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "p1", "data": {}}) is None, "closed"


def test_buffers_are_bytes_and_bad_base64_drops_the_message():
    relay = CommRelay()
    opened(relay, "ImageModel", {})
    _, _, buffers, _ = relay.to_page({"type": V.COMM_MSG, "comm_id": "c1", "data": {},
                                   "buffers": [base64.b64encode(b"\x89PNG").decode()]})
    assert buffers == [b"\x89PNG"]
    assert relay.to_page({"type": V.COMM_MSG, "comm_id": "c1", "data": {}, "buffers": ["not base64!"]}) is None


def test_passthrough_leaves_state_as_the_sandbox_wrote_it():
    relay = CommRelay(passthrough=True)
    _, content, _, _ = opened(relay, "HTMLModel", {"value": "<b>x</b>"})
    assert content["data"]["state"]["value"] == "<b>x</b>"


def test_html_as_text_keeps_what_it_says():
    assert html_as_text("100%|<b>██</b>| 10/10 [00:01&lt;00:00]") == "100%|██| 10/10 [00:01&lt;00:00]"
