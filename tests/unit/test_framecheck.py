"""The edge check and the runtime's trimming, as pure functions: what the supervisor refuses,
and that whatever the runtime trims is something it accepts.

The red-team probes (tests/security/test_redteam_frames.py) drive the same code through a
real sandbox; these pin down each rule and its message cheaply.
"""

from __future__ import annotations

import json

import pytest

from sandbox.runtime import fitting, framecheck
from sandbox.runtime import vocabulary as V

LIMIT = framecheck.frame_limit(10 * 1024 * 1024)


def refused(payload: bytes) -> str:
    with pytest.raises(framecheck.Violation) as info:
        framecheck.load(payload)
    return str(info.value)


def test_structure_is_counted_before_parsing():
    many = json.dumps({"type": "display_data", "data": {}, "metadata": {"m": [{}] * 100_000}}).encode()
    assert "100004 objects and arrays" in refused(many)
    deep = b'{"type":"stream","name":"stdout","text":' + b"[" * 70 + b"]" * 70 + b"}"
    assert "deeper than 64" in refused(deep)
    items = json.dumps({"type": "display_data", "data": {}, "metadata": {"m": [0] * 300_000}}).encode()
    assert "items" in refused(items)


def test_brackets_and_commas_inside_strings_are_text():
    text = json.dumps({"type": "stream", "name": "stdout", "text": '[{,"\\' * 500_000}).encode()
    assert framecheck.load(text)["text"].startswith('[{,"\\')


@pytest.mark.parametrize("frame, words", [
    ({"type": "display_data", "data": [1, 2]}, "field 'data' must be an object"),
    ({"type": "done", "status": "ok", "execution_count": "NaN"}, "'execution_count' must be an integer"),
    ({"type": "done", "status": "fine", "execution_count": 1}, "'status' must be one of"),
    ({"type": "done", "status": "ok", "execution_count": 1, "reason": "bored"}, "'reason' must be one of"),
    ({"type": "error", "ename": "E", "evalue": "v", "traceback": [1]}, "array of strings"),
    ({"type": "stream", "name": "stdout", "text": "x", "sneaky": 1}, "no field 'sneaky'"),
    ({"type": "stream", "name": "stdout"}, "lacks its field 'text'"),
    ({"type": "execute_result", "data": {"text/plain": 5}, "execution_count": 1}, "to a string"),
    ({"type": "shell"}, "not one a sandbox sends"),
    ({"type": "reply", "id": [1]}, "'id' must be an integer"),
])
def test_fields_are_checked_against_the_vocabulary(frame, words):
    assert words in refused(json.dumps(frame).encode())


def test_strict_json_only():
    assert "NaN is not a JSON number" in refused(b'{"type":"done","status":"ok","execution_count":NaN}')
    assert "not an object" in refused(b"[1]")
    assert "not valid JSON" in refused(b'{"type": "stream", "name": "stdout", "text": "\xff"}')


def test_json_mime_types_may_hold_json():
    frame = {"type": "display_data", "data": {"application/vnd.plotly.v1+json": {"x": [1, 2]}, "text/plain": "p"},
             "metadata": {}, "transient": {}}
    assert framecheck.load(json.dumps(frame).encode()) == frame


def test_a_huge_exception_is_trimmed_into_a_frame_the_edge_accepts():
    event = V.error_event("ValueError", "q" * 30_000_000, ["Traceback", "ValueError: " + "q" * 30_000_000], "x1")
    fitted, data = fitting.fit(event, 10 * 1024 * 1024, LIMIT)
    assert fitted["truncated"] is True and fitted["ename"] == "ValueError"
    assert len(data) < 512 * 1024 and "characters of the exception's value cut" in fitted["evalue"]
    assert framecheck.load(data)["traceback"][-1].startswith("ValueError: qqq")


def test_output_past_the_budget_is_cut_then_dropped():
    stream = V.stream_event("stdout", "a" * 100_000, "x1")
    fitted, data = fitting.fit(stream, 10_000, LIMIT)
    assert fitted["truncated"] is True and framecheck.frame_cost(len(data)) <= 10_000
    assert fitting.fit(stream, 100, LIMIT) == (None, None)
    display = {"type": "display_data", "exec": "x1", "data": {"text/plain": "x", "image/png": "A" * 50_000},
               "metadata": {"m": [{}] * 50_000}, "transient": {}}
    fitted, data = fitting.fit(display, 1_000_000, LIMIT)
    assert fitted["metadata"] == {} and "image/png dropped" in fitted["data"]["text/plain"]
    framecheck.load(data)
