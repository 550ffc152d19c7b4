"""The channel to the runtime: requests and their replies, and where each frame goes.

Every frame from the runtime is checked before anything trusts it: its size from its
header, its structure before it is parsed, its fields against the vocabulary
(``framecheck``). Then it is routed: a `reply` to the request waiting for it, a
command's events to that command's session, an execute's events to the cell in flight
(within its output budget). A frame that fails, or a flood of frames no runtime sends,
stops the sandbox with reason ``protocol`` and says what was wrong.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from typing import Awaitable, Callable

from ..runtime import framecheck
from ..runtime import vocabulary as V
from ..runtime.protocol import ProtocolError, read_payload, write_frame
from .runs import CellRun, CommandRun, command_frame_problem

# Past its output budget an execute's frames are dropped unread, but for its `done` (the
# runtime encodes the type first): a flood of tiny frames costs a prefix test each.
DONE_PREFIX = b'{"type":"done"'
# ... and its input_request, which the cell waits on (it would wait until its timeout).
# Neither is output: the runtime charges neither to the budget, nor does the supervisor.
INPUT_PREFIX = b'{"type":"input_request"'
# The runtime charges everything it sends during an execute to that execute's budget, by
# the same count (framecheck.frame_cost), and the supervisor's budget has FRAME_SLACK more:
# a cell's output goes past the supervisor's budget only when the cell wrote frames onto
# the channel itself. A few such frames are dropped (the cell is truncated, and told at
# once); this many more after the first one over the budget are a flood, and the sandbox is
# stopped (`protocol`). Counted in frames, since it is per frame that the host pays: each
# costs it a read of its header, so the sandbox ends within a few milliseconds of host work
# after its output passed its budget, however small its frames.
FLOOD_FRAMES = 1024
# A sandbox that sends this many times an execute's budget on its channel, in frames of any
# kind or execution, is flooding it too (the bound on frames that are not the cell's).
FLOOD_FACTOR = 4


class RuntimeChannel:
    """The supervisor's end of the runtime's channel, and the sessions reading from it:
    at most one cell (``cell``) and up to MAX_COMMANDS commands (``commands``)."""

    def __init__(self, spec: dict, finished: asyncio.Event, stop: Callable[[str, str], Awaitable[None]]):
        self.spec = spec  # its limits change when a pooled sandbox is claimed
        self.finished = finished
        self.stop = stop  # kill(reason, message): how a protocol violation ends the sandbox
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.cell: CellRun | None = None
        self.commands: dict[str, CommandRun] = {}
        self.bytes_since_execute = 0  # frame bytes from the runtime since the last execute began

    def next_id(self) -> int:
        """Request ids and execute/command ids share one counter: each is unique on the channel."""
        return next(self.ids)

    def output_budget(self) -> int:
        return int(self.spec["limits"]["output_bytes"]) + framecheck.FRAME_SLACK

    async def send(self, frame: dict) -> None:
        await write_frame(self.writer, frame)

    async def request(self, message: dict, timeout: float = 30.0) -> dict:
        if self.finished.is_set():
            raise RuntimeError("the sandbox is not running")
        rid = self.next_id()
        message["id"] = rid
        future = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        await write_frame(self.writer, message)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the sandbox's interpreter did not answer the {message.get('op')} request within "
                               f"{timeout:g} s (it may be busy, or the host loaded); try again") from None
        finally:
            self.pending.pop(rid, None)

    async def close(self, reason: str, message: str) -> None:
        """The runtime died: every session and request waiting on it learns why."""
        if self.cell is not None:
            await self.cell.events.put({"type": "_died", "reason": reason, "message": message})
        for command in list(self.commands.values()):
            await command.events.put({"type": "_died", "reason": reason, "message": message})
        for future in self.pending.values():
            if not future.done():
                future.set_exception(RuntimeError(message))

    async def read(self, reader: asyncio.StreamReader) -> None:
        """Read and route frames until the runtime's end closes or breaks the protocol."""
        max_frame = framecheck.frame_limit(self.spec["limits"]["output_bytes"])
        while True:
            try:
                payload = await read_payload(reader, max_frame)
                frame = self._admit(payload)
            except ProtocolError as exc:
                # The runtime never sends such a frame: code in the sandbox wrote to the
                # channel. Nothing it says can be trusted any more, so the sandbox ends.
                await self._end_for_protocol(reader, str(exc))
                return
            except (EOFError, OSError):
                return
            if frame is None:
                cell = self.cell
                notice = cell.truncation_notice(self.spec["limits"]["output_bytes"]) if cell is not None else None
                if notice is not None:
                    await cell.events.put(notice)
                continue
            kind = frame["type"]
            if kind == V.REPLY:
                future = self.pending.pop(frame.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(frame)
                continue
            if kind in V.COMMAND_EVENTS and frame.get("exec") in self.commands:
                problem = command_frame_problem(frame)
                if problem:
                    await self._end_for_protocol(reader, problem)
                    return
                await self.commands[frame["exec"]].events.put(frame)
                continue
            cell = self.cell
            if cell is not None and frame.get("exec") == cell.id:
                if kind == V.DONE and cell.dropped:
                    frame["truncated"] = True
                elif kind != V.DONE:
                    cell.cut = cell.cut or bool(frame.get("truncated"))
                await cell.events.put(frame)
            # Output of an execution that already ended (a background thread) is dropped.

    def _admit(self, payload: bytes) -> dict | None:
        """The checked frame, or None for output dropped (unread, once past the cell's
        budget); raises on a violation.

        While a cell runs, every output frame is charged to its budget, whichever execution
        it names (the runtime charges all it sends to the running execution): so a flood
        that names another execution is dropped unread past the budget as well.
        """
        cost = framecheck.frame_cost(len(payload))
        self.bytes_since_execute += cost
        limit = self.output_budget() * FLOOD_FACTOR
        if self.bytes_since_execute > limit:
            raise framecheck.Violation(f"it sent more than {limit} bytes of frames on its control channel "
                                       "during one execute, more than its runtime ever sends")
        cell = self.cell
        if cell is not None and cell.over_budget_at is not None:
            cell.past_budget += 1
            if cell.past_budget > FLOOD_FRAMES:
                raise framecheck.Violation(
                    f"after its cell's output passed its budget it sent {FLOOD_FRAMES} more frames on its control "
                    "channel, which its runtime never sends")
        # Charged before it is read (past the budget it is dropped unread), but for what is
        # not output; with commands running beside the cell every frame is parsed, to be routed.
        precharged = cell is not None and not self.commands \
            and not payload.startswith(DONE_PREFIX) and not payload.startswith(INPUT_PREFIX)
        if precharged and not cell.admit(cost):
            cell.skipped += 1
            return None
        frame = framecheck.load(payload)
        if cell is not None:
            cell.parsed += 1
        kind = frame["type"]
        if kind == V.REPLY:
            if frame.get("id") in self.pending:
                self.bytes_since_execute -= cost  # an answer the host asked for is not a flood
                if precharged:
                    cell.budget += cost  # ... nor the cell's output
        elif kind in V.COMMAND_EVENTS and frame.get("exec") in self.commands:
            self.bytes_since_execute -= cost  # a command's output has a budget of its own
        elif kind not in V.EXECUTE_EVENTS and kind not in V.COMMAND_EVENTS:
            raise framecheck.Violation(f"a {kind} frame is not expected now")
        elif cell is not None and not precharged and kind not in (V.DONE, V.INPUT_REQUEST) and not cell.admit(cost):
            cell.skipped += 1
            return None
        return frame

    async def _end_for_protocol(self, reader: asyncio.StreamReader, what: str) -> None:
        """Stop the sandbox for a protocol breach, reading its channel to the end meanwhile.

        Unread, the channel would hold up the sandbox's end under gVisor, where it is the
        container's stdout pipe: asyncio's stream stops reading a pipe whose buffer is full,
        so the pipe's close, and with it the process's exit (``wait()`` waits for its pipes),
        would never be seen; the cell would never learn that its sandbox died. What a flood
        or an oversized frame left in flight past the breach is more than that buffer."""
        drain = asyncio.create_task(_discard_until_eof(reader))
        try:
            await self._protocol_violation(what)
        finally:
            await drain

    async def _protocol_violation(self, what: str) -> None:
        message = (f"the sandbox broke the protocol of its control channel: {what}; it was stopped "
                   "and its variables are gone")
        print(f"supervisor: {message}", file=sys.stderr, flush=True)
        cell = self.cell
        if cell is not None and cell.over_budget_at is not None:
            print(f"supervisor: {cell.frame_counts()}; stopped {time.monotonic() - cell.over_budget_at:.6f} s "
                  "after its output passed its budget", file=sys.stderr, flush=True)
        await self.stop(V.PROTOCOL, message)


async def _discard_until_eof(reader: asyncio.StreamReader) -> None:
    """Read and drop what is left on a channel whose sandbox is being stopped."""
    try:
        while await reader.read(1 << 16):
            pass
    except (OSError, ValueError):
        pass
