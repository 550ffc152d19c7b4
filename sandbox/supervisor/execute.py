"""The execute session: one cell from the caller's request to its `done`.

Cells queue behind each other (FIFO, one at a time in the interpreter). While a cell
runs, its timeout, an interrupt and a caller that goes away are handled here: interrupt
first, and if the cell ignores the interrupt for INTERRUPT_GRACE seconds, kill the
sandbox (its variables are gone, and the caller is told so).
"""

from __future__ import annotations

import asyncio
import sys
import time

from ..common.background import spawn
from ..runtime import vocabulary as V
from ..runtime.protocol import write_frame
from .caller import CALLER_GONE, Session, watch_for_eof
from .deadlines import INTERRUPT_GRACE
from .runs import CellRun

# What of an execute (or comm) request the runtime is handed, by op.
FORWARDED = {
    V.OP_EXECUTE: ("code", "silent", "store_history", "allow_stdin", "user_expressions", "msg_id", "stream_limit"),
    V.OP_COMM: ("msg_type", "comm_id", "data", "metadata", "buffers", "target_name", "msg_id"),
}
# What the runtime's done carries for the execute reply, passed on to the caller.
REPLY_EXTRAS = ("payload", "user_expressions")
# Put on a cell's queue when its input() was answered (the timeout's clock goes on).
ANSWERED = "_answered"

# A merged stream event holds at most this many characters (plus one frame's): the size of
# what the runtime itself sends at a time, so merging never makes an event a caller could
# not take.
MERGE_MAX_CHARS = 64 * 1024


def merge_streams(first: dict, queue: asyncio.Queue) -> tuple[dict, dict | None]:
    """``first`` (a stream event) with the stream events of the same name queued right
    behind it, as one event; and the event that ended the run (None if the queue ran dry),
    which the caller must pass on next.

    A cell that writes many tiny frames (a flush per character, or a flood written onto
    its channel) then costs the supervisor, the server and the client one event per
    batch rather than one per frame. Only events already waiting are merged, never waited
    for, so an interactive print goes out as soon as it arrives; order with every other
    event is kept, since the merge stops at the first event of another kind or name.
    """
    parts, size, truncated = [first["text"]], len(first["text"]), bool(first.get("truncated"))
    held = None
    while size < MERGE_MAX_CHARS:
        try:
            event = queue.get_nowait()
        except asyncio.QueueEmpty:
            break
        if event.get("type") != V.STREAM or event.get("name") != first.get("name"):
            held = event
            break
        parts.append(event["text"])
        size += len(event["text"])
        truncated = truncated or bool(event.get("truncated"))
    if len(parts) == 1:
        return first, held
    merged = {**first, "text": "".join(parts)}
    if truncated:
        merged["truncated"] = True
    return merged, held


def cell_usage(usage: dict) -> dict:
    """What a cell's ``done`` carries of its sandbox's usage: enough for the kernel to warn
    that memory is close to the limit, and to say the peak an out-of-memory end reached."""
    return {k: usage[k] for k in ("memory_bytes", "memory_peak_bytes", "cpu_seconds")}


class ExecuteSession(Session):
    """Runs one execute request for the caller on ``reader``/``writer``; a comm message from
    the frontend (op ``comm``) runs the same way, its handlers being the cell."""

    async def run(self) -> bool:
        """Run the cell; returns whether the caller is still there to send another request."""
        supervisor, record = self.supervisor, self.record
        async with supervisor.exec_lock:
            if supervisor.finished.is_set() or record["state"] != V.RUNNING:
                await write_frame(self.writer, V.error_event("SandboxUnavailable", f"the sandbox is {record['state']}"))
                await write_frame(self.writer, record.done_event(V.ERROR, reason=record.end_reason()))
                return True
            cell = CellRun(f"x{self.channel.next_id()}", self.channel.output_budget())
            self.channel.bytes_since_execute = 0
            self.channel.cell = cell
            record.touch()
            watch_caller = asyncio.create_task(watch_for_eof(self.reader, self.caller_gone, cell.events))
            try:
                done = await self._stream(cell)
            finally:
                watch_caller.cancel()
                self.channel.cell = None
            # The watcher must be gone before the connection's next request is read: a
            # stream has one reader at a time.
            await asyncio.gather(watch_caller, return_exceptions=True)
            await self._finish(cell, done)
            return not self.caller_gone.is_set()

    async def _stream(self, cell: CellRun) -> dict:
        """Pass the cell's events to the caller until its `done`; interrupt, then kill, on
        timeout or when the caller leaves."""
        timeout = self.request.get("timeout_seconds") or self.supervisor.spec["limits"]["timeout_seconds"]
        phase = "running"  # of the cell: running, interrupting, killing
        op = self.request.get("op", V.OP_EXECUTE)
        await self.channel.send({"op": op, "exec": cell.id, "store_history": True,
                                 **{k: self.request[k] for k in FORWARDED[op] if k in self.request}})
        deadline = time.monotonic() + float(timeout)
        interrupted_for_caller = False
        held: dict | None = None  # the event that ended a merge, next in line
        while True:
            if self.caller_gone.is_set() and not interrupted_for_caller and phase == "running":
                interrupted_for_caller = True
                await self._interrupt_quietly(cell, {"reason": "client_disconnected"})
            event, held = held, None
            if event is None and time.monotonic() < deadline:  # what is queued, without a timer
                try:
                    event = cell.events.get_nowait()
                except asyncio.QueueEmpty:
                    pass
            try:
                if event is None:
                    wait = deadline - time.monotonic()
                    # asyncio.timeout, not wait_for: no task of its own for each wait
                    async with asyncio.timeout(max(0.0, wait) if wait != float("inf") else None):
                        event = await cell.events.get()
            except TimeoutError:
                if phase == "running":
                    phase = "interrupting"
                    await self._interrupt_quietly(cell, {"reason": "timeout", "timeout_seconds": timeout})
                    deadline = time.monotonic() + INTERRUPT_GRACE
                else:
                    phase = "killing"
                    message = (f"the cell ran past its {timeout} s timeout and ignored the interrupt, "
                               "so the sandbox was killed; its variables are gone")
                    spawn(self.supervisor.kill(V.TIMEOUT_KILLED, message))
                    deadline = time.monotonic() + 30
                continue
            kind = event.get("type")
            if kind == CALLER_GONE:
                continue  # back to the top, which interrupts the cell
            if kind == V.INPUT_REQUEST and phase == "running" and cell.waiting_input is None:
                # Waiting for a person is not running: the timeout stops until the answer.
                cell.waiting_input = max(0.0, deadline - time.monotonic())
                deadline = float("inf")
            if kind == ANSWERED:
                if cell.waiting_input is not None:
                    deadline = time.monotonic() + cell.waiting_input
                    cell.waiting_input = None
                continue
            if kind == V.DONE:
                return event
            if kind == "_died":
                await self.send(V.reason_error_event(event["reason"], event["message"]))
                return {"status": V.ERROR, "reason": event["reason"]}
            if kind == V.STREAM:
                event, held = merge_streams(event, cell.events)
            event.pop("exec", None)
            await self.send(event)

    async def _finish(self, cell: CellRun, done: dict) -> None:
        record = self.record
        if done.get("execution_count") is not None:
            record["execution_count"] = done["execution_count"]
        record.touch()
        record.save_soon_if_running()
        if cell.over_budget_at is not None and done.get("reason") != V.PROTOCOL:  # a stop logs its own
            print(f"supervisor: {cell.frame_counts()}; the cell ended truncated", file=sys.stderr, flush=True)
        if cell.dropped:
            await self.send(V.stream_event(
                V.STDERR, f"\n[sandbox: {cell.dropped} bytes of output over the limit of "
                          f"{self.supervisor.spec['limits']['output_bytes']} bytes were dropped]\n"))
        truncated = bool(done.get("truncated")) or bool(cell.dropped) or cell.cut
        meter = self.supervisor.usage.meter
        if self.request.get("op", V.OP_EXECUTE) == V.OP_EXECUTE:
            meter.count_execute()
        await self.send(record.done_event(
            done.get("status", V.ERROR), execution_count=done.get("execution_count"),
            duration=done.get("duration") or 0.0, truncated=truncated, reason=done.get("reason"),
            usage=cell_usage(meter.sample(with_disk=False)), **{k: done[k] for k in REPLY_EXTRAS if k in done}))

    async def _interrupt_quietly(self, cell: CellRun, why: dict) -> None:
        try:
            await self.channel.request({"op": "interrupt", "exec": cell.id, **why}, timeout=2)
        except Exception:
            pass
