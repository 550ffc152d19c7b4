"""What a frontend asks of a sandbox through the HTTP API: payloads in done, answers to
input() (POST /input), comm messages in (POST /comm) and out (events). A real server."""

from __future__ import annotations

import json
import threading

import pytest

from support import done_of, of_type, ok, stream_text
from svc_support import api_error, sandbox_for_module


@pytest.fixture(scope="module")
def sid(sandbox_server):
    yield from sandbox_for_module(sandbox_server)


def test_done_carries_the_pager_and_user_expressions(sid, run):
    done = done_of(ok(run(sid, "y = 6\nlen?", user_expressions={"seven": "y + 1"})))
    assert done["payload"][0]["source"] == "page"
    assert done["user_expressions"]["seven"]["data"] == {"text/plain": "7"}


def test_input_waits_for_post_input(sid, api):
    events = []

    def stream():
        with api.stream("POST", f"/v1/sandboxes/{sid}/execute",
                        json={"code": "print('echo', input('say? '))", "allow_stdin": True}) as response:
            for line in response.iter_lines():
                event = json.loads(line)
                events.append(event)
                if event["type"] == "input_request":
                    assert event == {"type": "input_request", "prompt": "say? ", "password": False}
                    assert api.post(f"/v1/sandboxes/{sid}/input", json={"value": "hi"}).json() == {"delivered": True}

    reader = threading.Thread(target=stream)
    reader.start()
    reader.join(120)
    assert stream_text(events, "stdout") == "echo hi\n"
    assert done_of(events)["status"] == "ok"


def test_an_answer_with_no_question_is_not_delivered(sid, api):
    assert api.post(f"/v1/sandboxes/{sid}/input", json={"value": "nobody asked"}).json() == {"delivered": False}


def test_input_without_allow_stdin_raises(sid, run):
    events = run(sid, "input()")
    assert of_type(events, "error")[0]["ename"] == "StdinNotImplementedError"


def test_comm_messages_go_both_ways(sid, run, api):
    events = ok(run(sid, "import ipywidgets as w\ns = w.IntSlider(1)\nseen = []\n"
                         "s.observe(lambda c: print('now', c['new']), 'value')\ndisplay(s)"))
    (slider,) = [e for e in of_type(events, "comm_open") if e["data"]["state"]["_model_name"] == "IntSliderModel"]
    with api.stream("POST", f"/v1/sandboxes/{sid}/comm", json={
            "msg_type": "comm_msg", "comm_id": slider["comm_id"],
            "data": {"method": "update", "state": {"value": 9}, "buffer_paths": []}}) as response:
        assert response.status_code == 200
        back = [json.loads(line) for line in response.iter_lines()]
    assert stream_text(back, "stdout") == "now 9\n"
    assert done_of(back)["status"] == "ok"


@pytest.mark.parametrize("route,body", [
    ("input", {}),
    ("input", {"value": 3}),
    ("comm", {"comm_id": "x"}),
    ("comm", {"msg_type": "shell_exec", "comm_id": "x"}),
    ("comm", {"msg_type": "comm_msg", "comm_id": "x" * 300}),
    ("execute", {"code": "1", "user_expressions": {"a": 1}}),
])
def test_bad_bodies_get_422(sid, api, route, body):
    api_error(api.post(f"/v1/sandboxes/{sid}/{route}", json=body), 422)


def test_stream_limit_cuts_text_in_the_sandbox_with_a_note_event(sid, run):
    events = run(sid, "print('a' * 5000)\nprint('after')", stream_limit=1000)
    assert stream_text(events, "stdout") == "a" * 1000
    (note,) = [e for e in of_type(events, "stream") if e.get("note")]
    assert note["name"] == "stderr" and "past the first 1000 bytes were dropped" in note["text"]
    assert done_of(events)["truncated"] is True
    # The control: the same cell without the caller's limit sends all of it.
    whole = run(sid, "print('a' * 5000)\nprint('after')")
    assert stream_text(whole, "stdout") == "a" * 5000 + "\nafter\n" and not done_of(whole)["truncated"]


@pytest.mark.parametrize("bad", [-1, "1000", 1.5, True])
def test_a_bad_stream_limit_is_a_clear_422(sid, api, bad):
    response = api.post(f"/v1/sandboxes/{sid}/execute", json={"code": "1", "stream_limit": bad})
    assert "stream_limit" in api_error(response, 422)["message"]
