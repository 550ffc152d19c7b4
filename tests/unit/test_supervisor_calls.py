"""The server's side of the control socket: replies, refusals, and an execute stream cut off
by a supervisor's death, each against a real unix socket speaking the real frames."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import tempfile

import pytest

from sandbox.common import statefile
from sandbox.common.errors import ApiError
from sandbox.runtime import vocabulary as V
from sandbox.runtime.protocol import read_frame, write_frame

from sandbox_dirs import handle_of, new_manager, sleeper


def serve(handle, answer):
    """A control socket whose every connection gets ``answer(request, writer)``."""
    async def on_connection(reader, writer):
        request = await read_frame(reader)
        await answer(request, writer)
        writer.close()
    return asyncio.start_unix_server(on_connection, handle.socket)


@pytest.fixture
def running():
    short = tempfile.mkdtemp(prefix="sbk-unit-")  # a unix socket's path holds at most 107 bytes
    manager = new_manager(pathlib.Path(short))
    process = sleeper()
    handle = handle_of(manager, "sbx-s", V.RUNNING, process=process)
    yield manager, handle, process
    process.kill()
    process.wait()
    shutil.rmtree(short, ignore_errors=True)


def test_a_reply_updates_the_record_and_a_refusal_is_a_409_with_its_reason(running):
    manager, handle, _ = running

    async def answer(request, writer):
        if request["op"] == "status":
            await write_frame(writer, {"ok": True, "state": {"state": V.RUNNING, "execution_count": 7}})
        else:
            await write_frame(writer, {"error": "conflict", "message": "a cell is running", "reason": "busy"})

    async def main():
        async with await serve(handle, answer):
            await manager.calls.call(handle, {"op": "status"})
            assert handle.record["execution_count"] == 7
            with pytest.raises(ApiError) as refused:
                await manager.calls.call(handle, {"op": "pause"})
            return refused.value

    refused = asyncio.run(main())
    assert (refused.status, refused.code, refused.extra) == (409, "conflict", {"reason": "busy"})


def test_a_live_supervisor_that_does_not_answer_is_503(running):
    manager, handle, _ = running  # alive, but nothing listens on its socket
    with pytest.raises(ApiError) as unavailable:
        asyncio.run(manager.calls.call(handle, {"op": "status"}))
    assert unavailable.value.status == 503 and "not answering" in unavailable.value.message


def execute_cut_off(running, sent: dict, reason: str, message: str) -> list[dict]:
    """The events an execute streams when its supervisor sends ``sent``, records its death
    (``reason``, ``message``) and dies before a `done`."""
    manager, handle, process = running

    async def answer(request, writer):
        await write_frame(writer, sent)
        await writer.drain()
        statefile.write_json(os.path.join(handle.dir, "state.json"),
                             {"id": handle.id, "state": V.DEAD, "dead_reason": reason,
                              "dead_message": message, "execution_count": 3}, durable=False)
        process.kill()
        process.wait()

    async def main():
        async with await serve(handle, answer):
            events = await manager.calls.open_execute(handle, {"code": "x = [0] * 10**10"})
            return [event async for event in events]

    return asyncio.run(main())


def test_an_execute_cut_off_by_a_death_ends_with_the_recorded_reason(running):
    manager, handle, _ = running
    events = execute_cut_off(running, {"type": "stream", "name": "stdout", "text": "hi\n"}, V.OOM, "it ran out of memory")
    assert [e["type"] for e in events] == ["stream", "error", "done"]
    assert events[1]["evalue"] == "it ran out of memory"
    assert events[2]["reason"] == V.OOM and events[2]["sandbox_state"] == V.DEAD
    assert handle.id in manager.registry.ended and handle.id not in manager.registry.live


def test_an_end_the_supervisor_told_before_it_exited_is_told_once(running):
    """A protocol stop: the supervisor sends the error naming it, then exits before its
    `done` goes out (a CI run saw the end told twice: the supervisor's words and the
    server's again). The caller hears the end once, and `done` from the record."""
    told = "the sandbox broke the protocol of its control channel: the frame holds 100001 objects and arrays"
    events = execute_cut_off(running, V.reason_error_event(V.PROTOCOL, told), V.PROTOCOL, told)
    assert [e["type"] for e in events] == ["error", "done"], events
    assert events[0]["evalue"] == told and events[1]["reason"] == V.PROTOCOL
