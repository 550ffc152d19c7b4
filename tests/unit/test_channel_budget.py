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
from sandbox.supervisor.runs import CellRun

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


OVERSIZED_THEN_MORE = r'''
import struct, sys, time
out = sys.stdout.buffer
out.write(struct.pack(">I", 60_000_000))  # a frame far over the limit, as an untrimmed 30 MB exception
chunk = b"q" * 65536
for _ in range(64):  # 4 MiB more in flight after the header: far more than the stream's buffer
    out.write(chunk)
out.flush()
time.sleep(60)  # as a runtime does until it is killed
'''


def test_a_channel_stopped_for_protocol_is_read_to_its_end_so_the_process_end_is_seen():
    """Under gVisor the channel is the container's stdout pipe. asyncio stops reading a pipe
    whose stream buffer is full, and its ``wait()`` waits for the pipes to close: a channel
    left unread after a protocol stop hid the process's exit for ever (the execute hung
    until the client gave up). Here the runtime is a real process writing an oversized frame
    and more behind it; the stop kills it, as the supervisor's does."""
    import sys

    async def scenario() -> int | None:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", OVERSIZED_THEN_MORE,
                                                    stdout=asyncio.subprocess.PIPE)
        stops: list[str] = []

        async def stop(reason: str, message: str) -> None:
            stops.append(reason)
            await asyncio.sleep(0.5)  # the writer fills the pipe and the stream's buffer meanwhile
            if proc.returncode is None:
                proc.kill()

        channel = RuntimeChannel({"limits": {"output_bytes": OUTPUT_BYTES}}, asyncio.Event(), stop)
        await asyncio.wait_for(channel.read(proc.stdout), 30)
        assert stops == [V.PROTOCOL]
        try:
            return await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            await proc.stdout.read()  # the test's own clean-up: read the pipe to its end ...
            await proc.wait()  # ... and the process is seen gone
            return None

    assert asyncio.run(scenario()) is not None, "the process's end was never seen: its pipe was left unread"
