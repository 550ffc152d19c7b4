"""The caller at the other end of a control connection, during a cell or a command.

A caller may go away at any moment: sending to it then stops (its session goes on to
end the cell or the command), and its leaving wakes the session's loop, which may be
waiting on a silent cell.
"""

from __future__ import annotations

import asyncio

from ..runtime.protocol import write_frame
from .core import SupervisorCore

CALLER_GONE = "_client_gone"  # a session-internal event type, never sent on a wire


async def send(writer: asyncio.StreamWriter, caller_gone: asyncio.Event, event: dict) -> None:
    if caller_gone.is_set():
        return
    try:
        await write_frame(writer, event)
    except (ConnectionError, OSError):
        caller_gone.set()


async def watch_for_eof(reader: asyncio.StreamReader, gone: asyncio.Event, wake: asyncio.Queue | None = None) -> None:
    try:
        while await reader.read(4096):
            pass
    except (ConnectionError, OSError):
        pass
    gone.set()
    if wake is not None:  # a silent cell sends no event: wake the execute loop so it interrupts
        try:
            wake.put_nowait({"type": CALLER_GONE})
        except asyncio.QueueFull:
            pass  # a full queue wakes it anyway


class Session:
    """What the execute and command sessions share: one request, its caller's connection,
    and whether the caller is still there."""

    def __init__(self, supervisor: SupervisorCore, request: dict,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.supervisor = supervisor
        self.channel = supervisor.channel
        self.record = supervisor.record
        self.request = request
        self.reader, self.writer = reader, writer
        self.caller_gone = asyncio.Event()

    async def send(self, event: dict) -> None:
        await send(self.writer, self.caller_gone, event)

    async def run(self) -> bool:
        """Serve the request; returns whether the caller is still there to send another."""
        raise NotImplementedError
