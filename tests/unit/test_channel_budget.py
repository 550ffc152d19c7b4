"""The supervisor's output budget per cell and its stop of a flood past it
(sandbox/supervisor/channel.py ``RuntimeChannel._admit``), fed payloads as a sandbox's
channel delivers them. The red-team test of the same flood, end to end through a real
server, is tests/security/test_redteam_frames.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from sandbox.runtime import framecheck
from sandbox.runtime import vocabulary as V
from sandbox.supervisor.channel import FLOOD_FRAMES, RuntimeChannel
from sandbox.supervisor.execute import CellRun

OUTPUT_BYTES = 4096


def payload(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def stream(exec_id: str = "x1", text: str = "zzzz") -> bytes:
    return payload({"type": V.STREAM, "exec": exec_id, "name": V.STDOUT, "text": text})


def channel_with_cell() -> tuple[RuntimeChannel, CellRun]:
    async def stop(reason: str, message: str) -> None:
        raise AssertionError("not reached: _admit raises, read() stops")

    channel = RuntimeChannel({"limits": {"output_bytes": OUTPUT_BYTES}}, asyncio.Event(), stop)
    cell = CellRun("x1", channel.output_budget())
    channel.cell = cell
    return channel, cell


def in_budget(frame: bytes) -> int:
    return (OUTPUT_BYTES + framecheck.FRAME_SLACK) // framecheck.frame_cost(len(frame))


def test_past_the_budget_frames_are_dropped_unread_then_a_flood_is_stopped():
    channel, cell = channel_with_cell()
    fits = in_budget(stream())
    assert all(channel._admit(stream()) is not None for _ in range(fits))
    assert cell.over_budget_at is None and cell.parsed == fits
    # Past the budget: dropped, never parsed (an invalid frame is not even noticed) ...
    assert channel._admit(stream()) is None and cell.over_budget_at is not None
    assert all(channel._admit(b'{"type":"stream","not json') is None for _ in range(FLOOD_FRAMES))
    assert cell.parsed == fits and cell.skipped == FLOOD_FRAMES + 1
    # ... and the next one is a flood.
    with pytest.raises(framecheck.Violation, match=f"{FLOOD_FRAMES} more frames"):
        channel._admit(stream())
    assert cell.parsed == fits and cell.past_budget == FLOOD_FRAMES + 1


def test_the_caller_is_told_once_the_moment_the_budget_is_passed():
    channel, cell = channel_with_cell()
    big = stream(text="z" * (OUTPUT_BYTES + framecheck.FRAME_SLACK))
    assert cell.truncation_notice(OUTPUT_BYTES) is None
    assert channel._admit(big) is None
    notice = cell.truncation_notice(OUTPUT_BYTES)
    assert notice["type"] == V.STREAM and notice["name"] == V.STDERR and notice["truncated"] is True
    assert f"passed its limit of {OUTPUT_BYTES} bytes" in notice["text"]
    assert cell.truncation_notice(OUTPUT_BYTES) is None


def test_frames_naming_another_execution_are_charged_to_the_running_cell():
    channel, cell = channel_with_cell()
    fits = in_budget(stream("x0"))
    assert all(channel._admit(stream("x0")) is not None for _ in range(fits))
    assert channel._admit(stream("x1")) is None and channel._admit(stream("x0")) is None
    assert cell.parsed == fits and cell.skipped == 2


def test_what_is_not_output_is_not_charged():
    """The runtime charges neither its done, nor an input_request, nor a reply the host asked
    for: nor does the supervisor, so an honest runtime never passes its budget."""
    channel, cell = channel_with_cell()
    loop = asyncio.new_event_loop()
    channel.pending[7] = loop.create_future()  # a request the host sent, waiting for its reply
    loop.close()
    budget = cell.budget
    assert channel._admit(payload({"type": V.REPLY, "id": 7, "ok": True}))["id"] == 7
    assert channel._admit(payload({"type": V.INPUT_REQUEST, "exec": "x1", "prompt": "?", "password": False}))
    assert cell.budget == budget
    while cell.over_budget_at is None:
        channel._admit(stream())
    done = channel._admit(payload(V.done_event(V.OK, execution_count=1, exec_id="x1")))
    assert done["type"] == V.DONE and cell.skipped == 1
