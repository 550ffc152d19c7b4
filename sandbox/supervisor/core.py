"""The supervisor as its sessions see it: the core they depend on, never the other way.

The core is the sandbox's state machine (``record.StateRecord`` over the vocabulary's
transitions) and its channel to the runtime (``channel.RuntimeChannel``, routing frames to
the ``runs`` under way). The sessions (``execute``, ``commands``, ``pausing``), the
deadlines and the control server are handed a supervisor and use it through this
protocol only; ``lifecycle.Supervisor`` is the one implementation, and the one module
that puts them all together.

    lifecycle ─▶ control ─▶ execute, commands, pausing, deadlines ─▶ caller ─▶ core
                                                                        core = record, channel, runs
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..isolation.host import HostResources
from .channel import RuntimeChannel
from .record import StateRecord


class SupervisorCore(Protocol):
    dir: str  # the sandbox's state directory
    spec: dict  # spec.json (its limits change when a pooled sandbox is claimed)
    record: StateRecord
    channel: RuntimeChannel
    host: HostResources
    finished: asyncio.Event  # set when nothing is left to supervise (ended, or paused)
    exec_lock: asyncio.Lock  # cells run one at a time, in the order they came
    proc: asyncio.subprocess.Process | None  # the isolation tool's process
    pausing: bool  # a checkpoint is under way: the process's exit is not a death
    kill_reason: tuple[str, str] | None
    tasks: list[asyncio.Task]

    def public_state(self) -> dict:
        """The record as the server sees it (status replies, ready)."""
        ...

    async def kill(self, reason: str, message: str) -> None:
        """Kill the sandbox's processes; ``reason`` is why, if nothing else was recorded."""
        ...

    async def end(self, state: str, message: str) -> None:
        """End the sandbox for good (expired, deleted) and record why."""
        ...

    async def watch_process(self) -> None:
        """Wait for the sandbox's process to exit and record its death."""
        ...
