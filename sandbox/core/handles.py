"""What the server knows of one sandbox: its handle, and the view of it a client is shown.

A handle is the server's side of a sandbox whose truth lives with its supervisor (its
``state.json`` and control socket): the last record heard, the process, the connections
kept for the next execute. Every part of the manager passes handles around; none keeps
a copy of a sandbox's state of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass, field

from ..common import paths, statefile
from ..runtime import vocabulary as V
from ..usage import meter


@dataclass
class Handle:
    id: str
    dir: str
    image: str
    uid: int | None
    pid: int | None = None
    process: subprocess.Popen | None = None
    # The supervisor's state record as last heard (its replies, a cell's `done`).
    record: dict = field(default_factory=dict)
    # Open connections to the supervisor that finished an execute, kept for the next one.
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    # The supervisor's state.json as last read, and the (inode, mtime, size) it was read at.
    saved: dict | None = None
    saved_at: tuple[int, int, int] | None = None
    # When a call last needed it running (``PauseResume.wake``), by this server's clock: the
    # sleeper counts idleness from this or the supervisor's ``used_at``, whichever is later,
    # so a call on its way (not yet at the supervisor) is never slept under.
    called_at: float = 0.0

    def saved_record(self) -> dict:
        """state.json, read again only when the supervisor replaced it (every save is a
        rename, so a new inode): it is consulted on every request."""
        path = os.path.join(self.dir, "state.json")
        try:
            found = os.stat(path)
        except OSError:
            return dict(self.record)
        key = (found.st_ino, found.st_mtime_ns, found.st_size)
        if key != self.saved_at:
            self.saved, self.saved_at = statefile.read_json(path), key
        return dict(self.saved or self.record)

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, "control.sock")

    def supervisor_alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_is_supervisor(self.pid, self.dir)

    def drop_idle(self) -> None:
        """Close the connections kept for the next execute (the supervisor is gone or resting)."""
        while self.idle:
            self.idle.pop()[1].close()


pid_is_supervisor = paths.is_supervisor_of


def freshest_usage(handle: Handle) -> dict | None:
    """The later-sampled of the usage the server last heard from the supervisor (a create, a
    status call) and the one in its state.json, which the supervisor writes after each cell
    and every usage_record_seconds: a list (answered without asking each supervisor) showed
    a sandbox's usage as of its boot, cells later."""
    heard = handle.record.get("usage")
    saved = handle.saved_record().get("usage")
    if not isinstance(saved, dict) or (heard and (heard.get("sampled_at") or "") >= (saved.get("sampled_at") or "")):
        return heard
    return saved


def describe(handle: Handle, egress: dict | None, sleeps_at: float | None = None) -> dict:
    """The sandbox as GET /v1/sandboxes/{id} shows it; ``egress``: its proxy's view, if any;
    ``sleeps_at``: when the sleeper will pause it if no call comes (sleeper.py)."""
    record = handle.record
    out = {
        "id": handle.id,
        "state": record.get("state"),
        "image": handle.image,
        "created_at": record.get("created_at"),
        "expires_at": statefile.iso(record.get("expires_at")),
        "max_expires_at": statefile.iso(record.get("max_expires_at")),
        "ttl_seconds": record.get("ttl_seconds"),
        "execution_count": record.get("execution_count", 0),
        "executing": bool(record.get("executing")),
        "commands_running": int(record.get("commands_running") or 0),
        "limits": {k: v for k, v in (record.get("limits") or {}).items()},
        "isolation": record.get("isolation", {}),
        "from_pool": bool(record.get("from_pool", record.get("claimed", False))),
        "dead_reason": record.get("dead_reason"),
        "metadata": record.get("metadata", {}),
    }
    if record.get("forked_from"):
        out["forked_from"] = record["forked_from"]
    if "memory_bytes" in record:
        out["memory_bytes"] = record["memory_bytes"]
    if egress is not None:
        out["egress"] = egress
    usage = freshest_usage(handle)
    if usage is not None:
        out["usage"] = meter.public(usage, egress)
    if (record.get("isolation") or {}).get("backend") == V.GVISOR:
        out["on_idle"] = record.get("on_idle") or V.ON_IDLE_DELETE
        out["paused_at"] = record.get("paused_at")
        out["paused_by"] = record.get("paused_by") if record.get("state") == V.PAUSED else None
        out["sleeps_at"] = statefile.iso(sleeps_at)
        out["checkpoint"] = record.get("checkpoint")
        out["timeline"] = record.get("timeline")  # the last pause, resume or fork's steps (timeline.py)
    elif sleeps_at is not None or record.get("state") == V.PAUSED:  # bwrap: it sleeps by value (value_sleep.py)
        out["paused_at"] = record.get("paused_at")
        out["paused_by"] = record.get("paused_by") if record.get("state") == V.PAUSED else None
        out["sleeps_at"] = statefile.iso(sleeps_at)
        out[V.BY_VALUE] = record.get(V.BY_VALUE) if record.get("state") == V.PAUSED else None
    return out
