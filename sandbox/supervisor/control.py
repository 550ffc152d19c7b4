"""The control server: the supervisor's unix socket, and the ops the server sends on it.

The socket lives in the sandbox's 0700 state directory (and is itself 0600). The server
keeps a connection open per sandbox for its executes, so that a cell does not pay for a
connect and an accept; one-off callers send one request and close. ``execute`` and
``command`` stream their events (their sessions are in ``execute`` and ``commands``);
every other op gets one reply frame.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from ..common.background import spawn
from ..runtime import vocabulary as V
from ..runtime.protocol import ProtocolError, read_frame, write_frame
from .commands import CommandSession, interrupt_command
from .core import SupervisorCore
from .execute import ANSWERED, ExecuteSession
from .pausing import pause, sleep_by_value
from .record import iso

MAX_REQUEST_BYTES = 64 * 1024 * 1024
# ops whose caller reads a stream of events, each served by a session
SESSIONS = {V.OP_EXECUTE: ExecuteSession, V.OP_COMM: ExecuteSession, "command": CommandSession}


def socket_path(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "control.sock")


class ControlServer:
    def __init__(self, supervisor: SupervisorCore):
        self.supervisor = supervisor
        self.record = supervisor.record
        self.path = socket_path(supervisor.dir)

    async def serve(self, ready_fd: int | None) -> None:
        """Listen, tell the server (on ``ready_fd``) that the sandbox is up, serve until it ends."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._handle, path=self.path, limit=1 << 20)
        finally:
            os.umask(old)
        self.record.save()
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": True, "state": self.supervisor.public_state()}) + "\n").encode())
            os.close(ready_fd)
        await self.supervisor.finished.wait()
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request after another on a connection, until the caller closes it.

        A caller that closes mid-execute has given up on the cell, which is interrupted
        (see ``ExecuteSession``).
        """
        try:
            while True:
                request = await read_frame(reader, MAX_REQUEST_BYTES)
                op = request.get("op")
                session = SESSIONS.get(op)
                if session is not None:
                    if not await session(self.supervisor, request, reader, writer).run():
                        return
                    continue
                handler = getattr(self, f"op_{op}", None)
                if handler is None:
                    reply = {"error": "invalid_request", "message": f"unknown op {op!r}"}
                else:
                    try:
                        reply = await handler(request)
                    except Exception as exc:  # report, never crash the supervisor
                        reply = {"error": "unavailable", "message": str(exc) or type(exc).__name__}
                await write_frame(writer, reply)
                if self.record["state"] == V.PAUSED:
                    self.supervisor.finished.set()  # paused: nothing left to supervise until a restore
        except (EOFError, ConnectionError, ProtocolError):
            pass
        finally:
            writer.close()

    async def op_ping(self, request: dict) -> dict:
        return {"ok": True}

    async def op_pause(self, request: dict) -> dict:
        by = request.get("by") if request.get("by") in V.PAUSED_BY else V.PAUSED_BY_REQUEST
        idle = request.get("idle_seconds")
        if isinstance(request.get(V.BY_VALUE), dict) and isinstance(idle, (int, float)):
            return await sleep_by_value(self.supervisor, request.get("message") or "idle", float(idle),
                                        request[V.BY_VALUE])
        return await pause(self.supervisor, request.get("message") or "it was asked to pause", by=by,
                           idle_seconds=float(idle) if isinstance(idle, (int, float)) else None)

    async def op_status(self, request: dict) -> dict:
        return {"ok": True, "state": self.supervisor.public_state()}

    async def op_claim(self, request: dict) -> dict:
        supervisor, record = self.supervisor, self.record
        if record["state"] != V.POOLED:
            return {"error": "conflict", "message": "sandbox is not in the pool"}
        now = time.time()
        V.advance(record, V.RUNNING)
        record.update(
            pooled=False, created_at=iso(now), claimed=True,
            ttl_seconds=request["ttl_seconds"], max_expires_at=now + request["max_lifetime_seconds"],
            metadata=request.get("metadata") or {},
        )
        limits = dict(record["limits"])
        limits.update(request.get("limits") or {})
        cgroup = supervisor.host.cgroup
        if cgroup is not None and limits != record["limits"]:
            cgroup.set_limits(limits.get("memory_mb"), supervisor.host.cgroup_pids(limits), limits.get("cpus"))
        record["limits"] = limits
        supervisor.spec["limits"] = limits
        supervisor.usage.meter.start_billing()
        supervisor.spec["max_lifetime_seconds"] = request["max_lifetime_seconds"]
        record.touch()
        record.save()
        return {"ok": True, "state": supervisor.public_state()}

    async def op_renew(self, request: dict) -> dict:
        """``ttl_seconds`` changes the sliding TTL (and drops an extension: expiry is then
        exactly that far ahead); ``extend_seconds`` pushes expiry that far ahead once."""
        record = self.record
        if request.get("ttl_seconds"):
            record["ttl_seconds"] = int(request["ttl_seconds"])
            record.pop("extended_until", None)
        if request.get("extend_seconds"):
            record["extended_until"] = time.time() + int(request["extend_seconds"])
        record.touch()
        record.save()
        return {"ok": True, "state": self.supervisor.public_state()}

    async def op_interrupt(self, request: dict) -> dict:
        channel = self.supervisor.channel
        if channel.cell is None:
            return {"ok": True, "interrupted": False}
        reply = await channel.request({"op": "interrupt", "exec": channel.cell.id}, timeout=5)
        return {"ok": True, "interrupted": bool(reply.get("interrupted"))}

    async def op_command_interrupt(self, request: dict) -> dict:
        return {"ok": True, "interrupted": await interrupt_command(self.supervisor.channel, request.get("command_id"))}

    async def op_commands(self, request: dict) -> dict:
        return {"ok": True, "commands": [
            {**run.summary, "started_at": iso(run.started_at)} for run in self.supervisor.channel.commands.values()]}

    async def op_input(self, request: dict) -> dict:
        """The answer to the running cell's input() (``input_reply`` to the runtime, at once:
        the cell waits in it); ``delivered`` false when no cell waits for one."""
        cell = self.supervisor.channel.cell
        if cell is None or cell.waiting_input is None:
            return {"ok": True, "delivered": False}
        await self.supervisor.channel.send({"op": V.OP_INPUT_REPLY, "exec": cell.id,
                                            "value": str(request.get("value", ""))})
        try:
            cell.events.put_nowait({"type": ANSWERED})
        except asyncio.QueueFull:
            pass  # the cell's clock stays stopped; it ends by an interrupt or the caller leaving
        return {"ok": True, "delivered": True}

    async def op_complete(self, request: dict) -> dict:
        return await self._forward(request, ("code", "cursor_pos"))

    async def op_inspect(self, request: dict) -> dict:
        return await self._forward(request, ("code", "cursor_pos", "detail_level"))

    async def op_is_complete(self, request: dict) -> dict:
        return await self._forward(request, ("code",))

    async def _forward(self, request: dict, keys: tuple[str, ...]) -> dict:
        reply = await self.supervisor.channel.request(
            {"op": request["op"], **{k: request.get(k) for k in keys if k in request}})
        reply.pop("id", None)
        reply.pop("type", None)
        reply["ok"] = True
        return reply

    async def op_save(self, request: dict) -> dict:
        return await self._saving(request, ("path", "max_bytes", "seconds"))

    async def op_restore(self, request: dict) -> dict:
        return await self._saving(request, ("path",))

    async def _saving(self, request: dict, keys: tuple[str, ...]) -> dict:
        """A save or restore by value (runtime/saving.py), which may take a while (``timeout``);
        the runtime's refusal (a cap, a time bound, an unloadable save) is a note, not a failure."""
        timeout = request.get("timeout")
        # After the running cell; the TTL waits for it too. It does not slide the TTL: a save
        # just before the TTL's end (core/end_saver.py) must not keep the sandbox alive.
        async with self.supervisor.exec_lock:
            reply = await self.supervisor.channel.request(
                {"op": request["op"], **{k: request[k] for k in keys if k in request}},
                timeout=float(timeout) if isinstance(timeout, (int, float)) else 600.0)
        return {"ok": True, "saved_state": reply.get("saved_state"), "refused": reply.get("error")}

    async def op_delete(self, request: dict) -> dict:
        supervisor = self.supervisor
        asyncio.get_running_loop().call_soon(
            lambda: spawn(supervisor.end(V.DELETED, request.get("message") or "it was deleted")))
        return {"ok": True}
