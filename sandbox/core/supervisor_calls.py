"""The server's calls to a sandbox's supervisor: one-shot requests, and the event streams of
executes and commands.

Every word the server says to a supervisor goes through here, over its control socket
(``runtime/protocol.py`` frames). A supervisor that does not answer or hangs up is asked
about at the registry: an ended sandbox answers 410 (and a stream ends with the reason it
died), a live one that does not answer 503.
"""

from __future__ import annotations

import asyncio
import logging

from ..common.errors import ApiError
from .handles import Handle
from .registry import Registry
from ..runtime import vocabulary as V
from ..runtime.protocol import ProtocolError, read_frame, write_frame

log = logging.getLogger("sandbox.core.manager")

MAX_STREAM_FRAME = 96 * 1024 * 1024  # one event of an execute or a command, from a supervisor
IDLE_CONNECTIONS = 2  # per sandbox: enough for a client that runs one cell after another


class _Stopping(Exception):
    """Set on the readers of open streams when the server shuts down."""


class SupervisorCalls:
    def __init__(self, registry: Registry, shutting_down: asyncio.Event):
        self.registry = registry
        # Set when the server stops: every stream ends with a note instead of waiting on.
        self.shutting_down = shutting_down
        self._reading: set[asyncio.StreamReader] = set()  # streams waiting for a frame
        self._shutdown_watch: asyncio.Task | None = None

    async def call(self, handle: Handle, request: dict, timeout: float = 30.0) -> dict:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(handle.socket), 5)
        except (OSError, asyncio.TimeoutError):
            raise self._gone_or_unavailable(handle) from None
        try:
            await write_frame(writer, request)
            reply = await asyncio.wait_for(read_frame(reader), timeout)
        except (EOFError, ProtocolError, OSError, asyncio.TimeoutError):
            raise self._gone_or_unavailable(handle) from None
        finally:
            writer.close()
        if reply.get("error"):
            raise ApiError(409 if reply["error"] == "conflict" else 503, reply["error"], reply.get("message", ""),
                           extra={"reason": reply["reason"]} if reply.get("reason") else None)
        if "state" in reply and isinstance(reply["state"], dict):
            handle.record = reply["state"]
        return reply

    def _gone_or_unavailable(self, handle: Handle) -> ApiError:
        self.registry.check(handle)
        if handle.id in self.registry.ended:
            return self.registry.gone_error(handle.id)
        return ApiError(503, "unavailable", f"sandbox {handle.id} is not answering")

    async def open_execute(self, handle: Handle, request: dict, op: str = V.OP_EXECUTE):
        """Hand the execute to the supervisor, then return its events as an async iterator.

        Connecting happens before the HTTP response starts, so a sandbox that cannot take
        the request gets a proper 4xx/5xx instead of a stream cut short. The connection of
        an earlier execute is reused when there is one: a connect and an accept per cell
        were a tenth of the server's time on a trivial cell.
        """
        frame = {"op": op, **request}
        while handle.idle:
            reader, writer = handle.idle.pop()
            if writer.is_closing() or reader.at_eof():
                writer.close()
                continue
            try:
                await write_frame(writer, frame)
            except OSError:
                writer.close()
                continue
            return self._execute_events(handle, reader, writer, frame)
        return self._execute_events(handle, *await self._connect_and_send(handle, frame))

    async def _connect_and_send(self, handle: Handle, frame: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.open_unix_connection(handle.socket, limit=1 << 20)
        except OSError as exc:
            log.warning("cannot reach the supervisor of %s: %s", handle.id, exc)
            raise self._gone_or_unavailable(handle) from None
        try:
            await write_frame(writer, frame)
        except OSError as exc:
            writer.close()
            log.warning("cannot send to the supervisor of %s: %s", handle.id, exc)
            raise self._gone_or_unavailable(handle) from None
        return reader, writer

    async def open_command(self, handle: Handle, request: dict):
        """Start a command and return its events (the `start` event first) as an async iterator.

        The supervisor's first frame says whether the command started; a refusal (too many
        running, the sandbox ending) becomes an HTTP error before the response begins.
        Each command has a connection of its own, closed at its end: closing it early is
        what tells the supervisor that the caller went away.
        """
        reader, writer = await self._connect_and_send(handle, {"op": V.OP_COMMAND, **request})
        try:
            first = await asyncio.wait_for(read_frame(reader), 30)
        except (EOFError, ProtocolError, OSError, asyncio.TimeoutError):
            writer.close()
            raise self._gone_or_unavailable(handle) from None
        if first.get("type") != V.START:
            writer.close()
            if first.get("error") == "gone":
                await asyncio.to_thread(self.registry.check, handle)
                if handle.id in self.registry.ended:
                    raise self.registry.gone_error(handle.id)
            status = {"too_many": 429, "gone": 409}.get(first.get("error"), 503)
            raise ApiError(status, str(first.get("error") or "unavailable"), str(first.get("message") or "refused"))
        return self._command_events(handle, first, reader, writer)

    async def _command_events(self, handle: Handle, first: dict, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter):
        yield first
        try:
            while True:
                try:
                    event = await self._next_frame(reader)
                except (EOFError, ProtocolError, OSError):
                    record, message = self._why_it_stopped(handle)
                    reason = record.get("dead_reason") or record.get("state")
                    yield V.command_done_event(
                        exit_code=None, signal=None, timed_out=False,
                        reason=reason if reason in V.REASONS else V.CRASHED, message=message, duration=0.0,
                        truncated=False, sandbox_state=record.get("state", V.DEAD))
                    return
                if event is None:
                    # Closing the connection (below) ends the command in the sandbox.
                    yield V.command_done_event(
                        exit_code=None, signal=None, timed_out=False, reason=V.SERVER_SHUTDOWN,
                        message="the sandbox server is shutting down; the command was stopped (the sandbox and "
                                "its variables are kept)", duration=0.0, truncated=False,
                        sandbox_state=handle.record.get("state", V.RUNNING))
                    return
                yield event
                if event.get("type") == V.DONE:
                    self._note_done(handle, event)
                    return
        finally:
            writer.close()

    async def _next_frame(self, reader: asyncio.StreamReader) -> dict | None:
        """The next frame a supervisor streams, or None once the server is shutting down.

        Raises as ``read_frame`` does when the stream ends or breaks. A caller that goes
        away while this waits cancels the read: nobody wants the frame. The shutdown
        reaches a waiting read as an exception set on its reader (`_stop_streams`), so a
        frame costs no task of its own.
        """
        if self.shutting_down.is_set():
            return None
        if self._shutdown_watch is None:
            self._shutdown_watch = asyncio.get_running_loop().create_task(self._stop_streams())
        self._reading.add(reader)
        try:
            return await read_frame(reader, MAX_STREAM_FRAME)
        except _Stopping:
            return None
        finally:
            self._reading.discard(reader)

    async def _stop_streams(self) -> None:
        """At shutdown, wake every stream waiting on its supervisor (see `_next_frame`)."""
        await self.shutting_down.wait()
        for reader in list(self._reading):
            reader.set_exception(_Stopping())

    def _why_it_stopped(self, handle: Handle) -> tuple[dict, str]:
        """After a supervisor's stream ended early: its tombstone record, and what to tell the caller."""
        self.registry.check(handle)
        record = self.registry.ended.get(handle.id) or {}
        return record, record.get("dead_message") or record.get("end_message") or "its supervisor stopped"

    def _note_done(self, handle: Handle, done: dict) -> None:
        """A cell's or a command's `done` carries the sandbox's new expiry and state."""
        if done.get("expires_at"):  # the execute renewed the TTL: GET /v1/sandboxes shows it
            handle.record["expires_at"] = done["expires_at"]
        if done.get("sandbox_state") in V.ENDED_STATES:
            self.registry.check(handle)

    async def _execute_events(self, handle: Handle, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              reused: dict | None = None):
        """Yield the events of one execute as the supervisor sends them.

        `reused` is the request when it went over a kept connection. A supervisor closes a
        connection only when it exits, so an end of file before the first event means it
        died, unless it is still alive: then the request never reached it, and is sent
        again over a new connection.
        """
        reusable = False
        told: set[tuple[str, str]] = set()  # the errors the supervisor sent, (ename, evalue)
        try:
            while True:
                try:
                    event = await self._next_frame(reader)
                except (EOFError, ProtocolError, OSError):
                    if reused is not None and handle.supervisor_alive():
                        writer.close()
                        try:
                            reader, writer = await self._connect_and_send(handle, reused)
                        except ApiError:
                            pass  # it is not answering after all: reported as below
                        else:
                            reused = None
                            continue
                    record, message = self._why_it_stopped(handle)
                    reason = record.get("dead_reason") or V.CRASHED
                    said = V.reason_error_event(reason, message)
                    if (said["ename"], said["evalue"]) not in told:
                        # The supervisor may have told the end itself and exited before
                        # its `done` went out: the caller hears the end once.
                        yield said
                    yield V.done_event(V.ERROR, reason=reason, execution_count=record.get("execution_count"),
                                       sandbox_state=record.get("state", V.DEAD))
                    return
                if event is None:
                    yield V.error_event("ServerShutdown", "the sandbox server is shutting down; the cell was "
                                        "interrupted (the sandbox and its variables are kept)")
                    yield V.done_event(V.ABORTED, reason=V.SERVER_SHUTDOWN,
                                       execution_count=handle.record.get("execution_count"),
                                       sandbox_state=handle.record.get("state", V.RUNNING))
                    return
                reused = None
                if event.get("type") == V.ERROR:
                    told.add((str(event.get("ename")), str(event.get("evalue"))))
                yield event
                if event.get("type") == V.DONE:
                    reusable = True
                    handle.record["execution_count"] = event.get("execution_count")
                    self._note_done(handle, event)
                    return
        finally:
            if reusable and len(handle.idle) < IDLE_CONNECTIONS and handle.id in self.registry.live:
                handle.idle.append((reader, writer))
            else:
                writer.close()  # mid-cell, this tells the supervisor to interrupt the cell
