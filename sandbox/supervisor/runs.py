"""What the channel routes a runtime's frames to: the cell in flight and the running commands.

These are the supervisor's core records of work under way, shared by the channel (which
fills their queues and charges a cell's output budget) and the sessions (which start them,
drain their queues and end them). They depend on nothing of the sessions, so the channel
does not either.
"""

from __future__ import annotations

import asyncio
import time

from ..runtime import vocabulary as V


class CellRun:
    """One cell in flight: its events on their way to the caller, and its output budget.

    The budget is the supervisor's own, behind the runtime's: the runtime trims its output
    to the same count, so only frames a cell wrote to the channel itself go past it.
    """

    def __init__(self, exec_id: str, budget: int):
        self.id = exec_id
        self.events: asyncio.Queue = asyncio.Queue(maxsize=256)
        self.budget = budget   # frame bytes (framecheck.frame_cost) its output may still take
        self.dropped = 0       # frame bytes of output dropped past the budget
        self.cut = False       # the runtime sent an output it had trimmed
        self.waiting_input: float | None = None  # timeout left when it asked for input, while it waits
        # What the supervisor did with the frames that arrived while the cell ran (logged at
        # its end): parsed as JSON, or dropped unread from their header once past the budget.
        self.parsed = 0
        self.skipped = 0
        self.past_budget = 0   # frames that arrived after the first one over the budget
        self.over_budget_at: float | None = None  # monotonic time of the first frame over the budget
        self.told = False      # the caller has heard that its output is being dropped

    def admit(self, cost: int) -> bool:
        """Charge an output frame; False (and counted) once the budget is spent."""
        if cost > self.budget:
            self.budget = 0
            self.dropped += cost
            if self.over_budget_at is None:
                self.over_budget_at = time.monotonic()
            return False
        self.budget -= cost
        return True

    def truncation_notice(self, output_bytes: int) -> dict | None:
        """The stderr event that tells the caller, the moment the cell's output first went
        past its budget, that the rest is dropped (once; None when already told or not past).
        It says ``truncated: true`` at once, rather than only in the cell's ``done``."""
        if self.over_budget_at is None or self.told:
            return None
        self.told = True
        event = V.stream_event(V.STDERR, f"\n[sandbox: this cell's output passed its limit of {output_bytes} bytes; "
                                         "the rest of it is dropped]\n")
        event["truncated"] = True
        return event

    def frame_counts(self) -> str:
        """What the supervisor's log says of the cell's frames (the tests and benchmark 8 read it)."""
        words = f"execute {self.id}: {self.parsed} frames parsed, {self.skipped} dropped unread past its output budget"
        if self.over_budget_at is not None:
            words += f", {self.past_budget} more frames after the first over it"
        return words


class CommandRun:
    """A command the runtime runs for one caller: its events, and what was asked of it."""

    def __init__(self, command_id: str, request: dict, timeout: float):
        self.id = command_id
        self.events: asyncio.Queue = asyncio.Queue(maxsize=256)
        self.started_at = time.time()
        self.timeout = timeout
        self.summary = {"command_id": command_id, "argv": request.get("argv"), "shell": request.get("shell"),
                        "cwd": request.get("cwd"), "timeout_seconds": timeout}


def command_frame_problem(frame: dict) -> str | None:
    """What is wrong with a command's frame from the runtime, if anything: the runtime
    never sends such a frame, so anything off means code in the sandbox wrote it."""
    if frame["type"] == V.STREAM:
        if frame.get("name") not in V.STREAM_NAMES or not isinstance(frame.get("text"), str):
            return "a command's stream frame without a stream name and text"
        return None
    exit_code, signum = frame.get("exit_code"), frame.get("signal")
    if exit_code is not None and (type(exit_code) is not int or not 0 <= exit_code <= 255):
        return "a command's exit code out of range"
    if signum is not None and (type(signum) is not int or not 1 <= signum <= 64):
        return "a command's signal out of range"
    duration = frame.get("duration")
    if type(duration) not in (int, float) or not 0 <= duration < 10 * 86400:
        return "a command's duration out of range"
    error = frame.get("error")
    if error is not None and (not isinstance(error, str) or len(error) > 4096):
        return "a command's error message that is not a short string"
    return None
