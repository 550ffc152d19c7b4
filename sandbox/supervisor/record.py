"""The state record: the fields of a sandbox's ``state.json``, and how they reach the disk.

A live supervisor is asked for its state; the file matters to a server that restarts
while the supervisor is gone, and as the tombstone of an ended sandbox. Lifecycle
changes are written at once and durably; a cell's count and expiry within a second.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from ..common import statefile
from ..runtime import vocabulary as V

SAVE_DELAY = 1.0


iso = statefile.iso


class StateRecord(dict):
    """The record itself is the dict written to ``state.json`` (``V.advance`` moves its
    ``state`` field); the methods say when and how it is written."""

    def __init__(self, sandbox_dir: str, spec: dict):
        now = time.time()
        super().__init__(
            id=spec["id"],
            state=V.BOOTING,
            pooled=bool(spec.get("pooled")),
            image=spec["image"],
            supervisor_pid=os.getpid(),
            booted_at=iso(now),
            created_at=iso(now),
            ttl_seconds=spec["ttl_seconds"],
            expires_at=now + spec["ttl_seconds"],
            max_expires_at=now + spec["max_lifetime_seconds"],
            execution_count=0,
            dead_reason=None,
            dead_message=None,
            limits=spec["limits"],
            isolation={},
            metadata=spec.get("metadata", {}),
            on_idle=spec.get("on_idle") or V.ON_IDLE_DELETE,
        )
        self.path = os.path.join(sandbox_dir, "state.json")
        self.save_later: asyncio.TimerHandle | None = None

    def resume_from_disk(self) -> None:
        """Take over the record of the paused sandbox this supervisor restores."""
        recorded = statefile.read_json(self.path)
        if recorded is None or recorded.get("state") != V.PAUSED:
            raise SystemExit(f"{os.path.dirname(self.path)} holds no paused sandbox to restore")
        for key in ("expires_at", "max_expires_at"):
            recorded[key] = statefile.epoch(recorded[key])
        recorded.update(supervisor_pid=os.getpid(), booted_at=iso(time.time()))
        self.clear()
        self.update(recorded)

    def save(self, durable: bool = True) -> None:
        if self.save_later is not None:
            self.save_later.cancel()
            self.save_later = None
        self["updated_at"] = iso(time.time())
        statefile.write_json(self.path, self, durable=durable)

    def save_if_possible(self) -> None:
        """Save on the way out: a sandbox whose directory went away (or whose disk is full)
        must still be killed, so the failure is reported, not raised."""
        try:
            self.save()
        except OSError as exc:
            print(f"supervisor: could not record state {self['state']!r}: {exc}", file=sys.stderr, flush=True)

    def save_soon(self) -> None:
        """Record a cell's count and expiry within a second, off the cell's path.

        The file only matters to a server that restarts while this supervisor is gone (a
        live supervisor is asked for its state instead), so a state a cell old is harmless;
        a write per cell (~0.4 ms of create-and-rename) on the way to `done` is not.
        Lifecycle changes still use `save`, at once and durably.
        """
        if self.save_later is None:
            self.save_later = asyncio.get_running_loop().call_later(SAVE_DELAY, self._save_deferred)

    def save_soon_if_running(self) -> None:
        """After a cell or a command: an ended sandbox has been saved durably already."""
        if self["state"] == V.RUNNING:
            self.save_soon()

    def _save_deferred(self) -> None:
        self.save_later = None
        try:
            self.save(durable=False)
        except OSError:  # a full disk: the next lifecycle save fails loudly, this one need not
            pass

    def touch(self) -> None:
        """Slide the TTL: every execute and every renew pushes expiry out, never past the cap,
        and never before a one-off extension (renew's extend_seconds) runs out. ``used_at``
        keeps when: the sleeper (sandbox/core/sleeper.py) counts idleness from it."""
        now = time.time()
        self["used_at"] = iso(now)
        expires = max(now + self["ttl_seconds"], self.get("extended_until") or 0)
        self["expires_at"] = min(expires, self["max_expires_at"])

    def end_reason(self) -> str | None:
        """Why this sandbox no longer takes cells: its dead_reason, or the state it ended in."""
        if self["state"] == V.DEAD:
            return self.get("dead_reason") or V.CRASHED
        return self["state"] if self["state"] in V.REASONS else None

    def done_event(self, status: str, *, execution_count: int | None = None, **fields) -> dict:
        """The `done` a client receives: the runtime's, with this sandbox's count, expiry and state."""
        if execution_count is None:
            execution_count = self["execution_count"]
        return V.done_event(status, execution_count=execution_count, expires_at=iso(self["expires_at"]),
                            sandbox_state=self["state"], **fields)

    def public(self) -> dict:
        """The record as callers see it: times as ISO strings."""
        fields = dict(self)
        fields["expires_at"] = iso(fields["expires_at"])
        fields["max_expires_at"] = iso(fields["max_expires_at"])
        return fields
