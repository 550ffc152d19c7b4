"""Where a pause, a resume or a fork spends its time: named steps, in the order they ran.

A pause or a restore crosses three processes (the server, the supervisor, runsc), and its
wall time alone says nothing of what to make faster. Each of them marks its own steps on
a ``Timeline``; the supervisor keeps its steps in the sandbox's record (``timeline``: the
last pause or restore, teardown included), where the server adds what it waited for
itself. Callers see it in the sandbox object (docs/api.md, "timeline"); the benchmark prints it.
"""

from __future__ import annotations

import time


class Timeline:
    """Steps of one operation: ``[name, seconds]`` pairs, each timed from the previous mark."""

    def __init__(self, operation: str, steps: list | None = None):
        self.operation = operation
        self.steps: list[list] = [list(s) for s in steps or []]
        self.last = time.monotonic()

    def mark(self, step: str) -> float:
        """Close the step that ran since the previous mark; its seconds."""
        now = time.monotonic()
        seconds = now - self.last
        self.steps.append([step, round(seconds, 3)])
        self.last = now
        return seconds

    def add(self, step: str, seconds: float) -> None:
        """A step timed elsewhere (another process's, or one that overlapped others)."""
        self.steps.append([step, round(seconds, 3)])

    def restart(self) -> None:
        """The next mark times from now (what ran since the last one is counted elsewhere)."""
        self.last = time.monotonic()

    def as_field(self) -> dict:
        return {"operation": self.operation, "steps": self.steps,
                "total_seconds": round(sum(s for _, s in self.steps), 3)}

    @classmethod
    def of(cls, record: dict, operation: str) -> "Timeline":
        """The record's timeline of ``operation`` carried on (a new one if it holds another's)."""
        held = record.get("timeline") or {}
        return cls(operation, held.get("steps") if held.get("operation") == operation else None)
