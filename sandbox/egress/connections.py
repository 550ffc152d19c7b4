"""Every connection a sandbox has open to the egress proxy, with its owner, its cap and its
timeouts.

A connection costs the server descriptors (the sandbox's side, and the host's once the request
is allowed) for as long as the sandbox keeps it open, so each one belongs to its sandbox and:

* a sandbox has at most ``per_sandbox`` open at once; one more is answered 429 and closed;
* all sandboxes together stay inside the server's descriptor budget (its reserve is never
  taken); past it, 503 and closed, naming what ran out;
* a connection that has not sent its request head within ``head_timeout`` seconds, or has moved
  no byte either way for ``idle_timeout`` seconds, is closed (one sweeper for the whole proxy);
* when the sandbox ends, every one of its connections is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from ..core.descriptors import DescriptorBudget

DESCRIPTORS_PER_CONNECTION = 2  # the sandbox's side and the host's


@dataclass(frozen=True)
class ConnectionLimits:
    per_sandbox: int = 64
    head_timeout: float = 10.0
    idle_timeout: float = 120.0


class ConnectionRefused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(eq=False)
class Tracked:
    """One open connection: what to close, and when it last moved."""
    sandbox_id: str
    transports: list = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    head_done: bool = False

    def touch(self) -> None:
        self.last = time.monotonic()

    def close(self) -> None:
        """Abort both sides: the serving task reads end of file and ends on its own (cancelling
        it would make asyncio's stream callback log the cancellation as an error)."""
        for transport in self.transports:
            with contextlib.suppress(Exception):
                transport.abort()


class ActivityReader:
    """A stream reader that marks its connection as active on every read that returns bytes."""

    def __init__(self, reader: asyncio.StreamReader, tracked: Tracked) -> None:
        self._reader, self._tracked = reader, tracked

    async def read(self, n: int = -1) -> bytes:
        data = await self._reader.read(n)
        if data:
            self._tracked.touch()
        return data

    def __getattr__(self, name):
        return getattr(self._reader, name)


class ConnectionTable:
    def __init__(self, limits: ConnectionLimits | None = None, budget: DescriptorBudget | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        self.budget = budget or DescriptorBudget()
        self.open: dict[str, set[Tracked]] = {}
        self._sweeper: asyncio.Task | None = None

    def admit(self, sandbox_id: str, writer) -> Tracked:
        """The new connection's record, or ConnectionRefused (the caller answers and closes)."""
        mine = self.open.setdefault(sandbox_id, set())
        if len(mine) >= self.limits.per_sandbox:
            raise ConnectionRefused(429, f"this sandbox already has {len(mine)} egress connections open, its cap "
                                    f"({self.limits.per_sandbox}); close some first")
        if not self.budget.room(DESCRIPTORS_PER_CONNECTION):
            raise ConnectionRefused(503, "the sandbox server is at its file descriptor budget (limit "
                                    f"{self.budget.limit}, {self.budget.reserve} kept for itself); retry later")
        tracked = Tracked(sandbox_id, [writer.transport])
        mine.add(tracked)
        self._ensure_sweeper()
        return tracked

    def release(self, tracked: Tracked) -> None:
        mine = self.open.get(tracked.sandbox_id)
        if mine is not None:
            mine.discard(tracked)

    def count(self, sandbox_id: str) -> int:
        return len(self.open.get(sandbox_id, ()))

    def close_sandbox(self, sandbox_id: str) -> int:
        """Close every connection of the sandbox (it ended); how many there were."""
        mine = self.open.pop(sandbox_id, set())
        for tracked in mine:
            tracked.close()
        return len(mine)

    def close_all(self) -> None:
        for sandbox_id in list(self.open):
            self.close_sandbox(sandbox_id)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        every = max(0.05, min(1.0, self.limits.head_timeout / 4, self.limits.idle_timeout / 4))
        while True:
            await asyncio.sleep(every)
            self.close_stale(time.monotonic())

    def close_stale(self, now: float) -> None:
        for mine in list(self.open.values()):
            for tracked in list(mine):
                late_head = not tracked.head_done and now - tracked.started > self.limits.head_timeout
                if late_head or now - tracked.last > self.limits.idle_timeout:
                    mine.discard(tracked)
                    tracked.close()
