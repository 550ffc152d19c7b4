"""The command session: one command run beside the interpreter, from `start` to its end.

Commands do not queue behind cells: the runtime runs each in a process of its own while
a cell may be running (at most MAX_COMMANDS at once). The first frame is a `start` (or
an error reply, which the server turns into an HTTP error); then `stream` events as the
program writes; then `done`. The timeout, an interrupt and a caller that goes away all
end the command the same way: a signal to its process group (SIGTERM for a timeout or a
lost caller, SIGINT for an interrupt), SIGKILL after a grace period, and after another
one the command is reported ended even if the runtime never confirmed it. The sandbox
and its interpreter are kept.
"""

from __future__ import annotations

import asyncio
import time

from ..runtime import vocabulary as V
from ..runtime.protocol import write_frame
from .caller import CALLER_GONE, Session, watch_for_eof
from .deadlines import INTERRUPT_GRACE
from .record import iso
from .runs import CommandRun

MAX_COMMANDS = 16  # running at once per sandbox: each holds a connection and a stream on the host
INTERRUPT = "_interrupt"  # a session-internal event type: the caller asked to interrupt


class CommandSession(Session):
    """Runs one command request for the caller on ``reader``/``writer``."""

    timed_out = False         # the command ran past its timeout
    reason: str | None = None  # why it was ended, if it was
    dropped = 0               # output bytes dropped past the budget

    async def run(self) -> bool:
        """Run the command; returns whether the caller is still there to send another request."""
        refusal = self._refusal()
        if refusal:
            await write_frame(self.writer, refusal)
            return True
        spec, channel = self.supervisor.spec, self.channel
        timeout = float(self.request.get("timeout_seconds") or spec["limits"]["timeout_seconds"])
        run = CommandRun(f"c{channel.next_id()}", self.request, timeout)
        channel.commands[run.id] = run
        self.record.touch()
        watch_caller = None
        try:
            await self.send({"type": V.START, "command_id": run.id})
            watch_caller = asyncio.create_task(watch_for_eof(self.reader, self.caller_gone, run.events))
            await channel.send({
                "op": V.OP_COMMAND, "exec": run.id, "argv": self.request["argv"], "cwd": self.request.get("cwd"),
                "env": self.request.get("env") or {}, "stdin": self.request.get("stdin"),
            })
            done = await self._stream(run, budget=int(spec["limits"]["output_bytes"]) * 2 + 32 * 1024 * 1024)
        finally:
            channel.commands.pop(run.id, None)
            if watch_caller is not None:
                watch_caller.cancel()
                await asyncio.gather(watch_caller, return_exceptions=True)
        await self._finish(run, done)
        return not self.caller_gone.is_set()

    def _refusal(self) -> dict | None:
        supervisor, record = self.supervisor, self.record
        if supervisor.finished.is_set() or record["state"] != V.RUNNING:
            return {"error": "gone", "message": f"the sandbox is {record['state']}"}
        if len(self.channel.commands) >= MAX_COMMANDS:
            return {"error": "too_many", "message": f"{MAX_COMMANDS} commands are already running "
                    "in this sandbox; wait for one to end"}
        return None

    async def _stream(self, run: CommandRun, budget: int) -> dict:
        """Pass the command's events to the caller until it ends; signal it to end on
        timeout, interrupt or a lost caller, escalating to SIGKILL and then giving up."""
        sent = 0
        deadline = time.monotonic() + run.timeout
        escalation = iter(("kill", "abandon"))
        stopping = False
        while True:
            if self.caller_gone.is_set() and not stopping:
                stopping, self.reason = True, V.CLIENT_DISCONNECTED
                await signal_command(self.channel, run, V.SIGNAL_TERMINATE)
                deadline = time.monotonic() + INTERRUPT_GRACE
            try:
                event = await asyncio.wait_for(run.events.get(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                if not stopping:
                    stopping, self.timed_out, self.reason = True, True, V.TIMEOUT
                    await signal_command(self.channel, run, V.SIGNAL_TERMINATE)
                elif next(escalation) == "kill":
                    await signal_command(self.channel, run, V.SIGNAL_KILL)
                else:
                    return {"exit_code": None, "signal": None, "message": (
                        "the command did not end after SIGKILL was asked for; the sandbox's runtime did not "
                        "confirm it (it may be busy in a cell), so the process may still be running")}
                deadline = time.monotonic() + INTERRUPT_GRACE
                continue
            kind = event.get("type")
            if kind == CALLER_GONE:
                continue  # back to the top, which ends the command
            if kind == INTERRUPT:
                if not stopping:
                    stopping, self.reason = True, V.INTERRUPTED
                    await signal_command(self.channel, run, V.SIGNAL_INTERRUPT)
                    deadline = time.monotonic() + INTERRUPT_GRACE
                continue
            if kind == "_died":
                self.reason = event["reason"] if event["reason"] in V.REASONS else V.KILLED
                return {"exit_code": None, "signal": None, "message": event["message"]}
            if kind == V.COMMAND_DONE:
                return event
            event.pop("exec", None)
            size = event_size(event)
            if sent + size > budget:
                self.dropped += size
                continue
            sent += size
            await self.send(event)

    async def _finish(self, run: CommandRun, done: dict) -> None:
        record = self.record
        self.supervisor.usage.meter.count_command()
        record.touch()
        record.save_soon_if_running()
        if self.dropped:
            await self.send(V.stream_event(
                V.STDERR, f"\n[sandbox: {self.dropped} bytes of output over the limit were dropped]\n"))
        await self.send(V.command_done_event(
            exit_code=done.get("exit_code"), signal=done.get("signal"), timed_out=self.timed_out, reason=self.reason,
            message=done.get("error") or done.get("message"),
            duration=done.get("duration", round(time.time() - run.started_at, 6)),
            truncated=bool(done.get("truncated") or self.dropped),
            expires_at=iso(record["expires_at"]), sandbox_state=record["state"]))


async def signal_command(channel, run: CommandRun, which: str) -> None:
    try:
        await channel.send({"op": V.OP_COMMAND_SIGNAL, "exec": run.id, "signal": which})
    except (ConnectionError, OSError):
        pass  # the runtime is gone: its death ends the command


async def interrupt_command(channel, command_id: str | None) -> bool:
    """Ask a running command's session to interrupt it; False if no such command runs."""
    run = channel.commands.get(command_id)
    if run is None:
        return False
    try:
        run.events.put_nowait({"type": INTERRUPT})
    except asyncio.QueueFull:  # the loop is behind on output: signal from here
        await signal_command(channel, run, V.SIGNAL_INTERRUPT)
    return True


def event_size(event: dict) -> int:
    if event.get("type") == V.STREAM:
        return len(event.get("text", ""))
    data = event.get("data") or {}
    return sum(len(v) if isinstance(v, str) else 64 for v in data.values()) + 64
