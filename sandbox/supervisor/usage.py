"""The supervisor's usage job: sample the sandbox's counters, keep them in its record, and
write its usage record (``usage.store``) every ``usage_record_seconds`` and when it ends.

The record is written by the supervisor because it is the one process that lives exactly as
long as the sandbox: a server killed with -9 loses nothing of it, and a supervisor killed
with -9 leaves its last periodic row, which the next server completes from state.json.
A pooled sandbox writes nothing until it is claimed (it is nobody's yet).
"""

from __future__ import annotations

import asyncio
import os
import sys

from ..common import statefile
from ..core import tenancy
from ..runtime import vocabulary as V
from ..usage import store as usage_store
from ..usage.meter import UsageMeter, is_measured
from .core import SupervisorCore

SAMPLE_EVERY = 5.0  # seconds between samples: the GiB-hour integrals' step
DEFAULT_RECORD_EVERY = 60.0


def state_root(sandbox_dir: str) -> str:
    """The state directory a sandbox directory (STATE/sandboxes/ID) belongs to."""
    return os.path.dirname(os.path.dirname(os.path.abspath(sandbox_dir)))


def owner_of(sandbox_dir: str) -> str:
    recorded = statefile.read_json(os.path.join(sandbox_dir, tenancy.FILE_NAME)) or {}
    owner = recorded.get("owner")
    return usage_store.owner_name(owner if isinstance(owner, int) else None)


class UsageJob:
    def __init__(self, supervisor: SupervisorCore, restoring: bool):
        self.supervisor = supervisor
        self.meter = UsageMeter(supervisor.record, supervisor.host, restoring,
                                root_pid=lambda: supervisor.proc.pid if supervisor.proc is not None else None)
        self.store = usage_store.UsageStore(usage_store.path_in(state_root(supervisor.dir)))
        self.record_every = float(supervisor.spec.get("usage_record_seconds") or DEFAULT_RECORD_EVERY)

    def write(self, ended: bool = False) -> None:
        """Upsert this sandbox's row (``ended``: its last, with its end); a failure is
        reported, never raised: the next write, or the server from state.json, makes up for it."""
        record = self.supervisor.record
        if record.get("pooled") or record["state"] == V.POOLED:
            return
        row = usage_store.record_row(record, owner_of(self.supervisor.dir),
                                     ended_at=record.get("ended_at") if ended else None)
        if ended:
            row["end_reason"] = record.end_reason() or V.DELETED
        try:
            self.store.upsert(row)
        except Exception as exc:  # sqlite3.Error, OSError: a full or read-only disk
            print(f"supervisor: could not write the usage record: {exc}", file=sys.stderr, flush=True)
            return
        if ended:
            record["usage_recorded"] = True  # the server need not complete it from state.json

    async def run(self) -> None:
        """Sample every few seconds; write the row (and state.json) every ``record_every``."""
        step = min(SAMPLE_EVERY, self.record_every)
        since_write = 0.0
        while not self.supervisor.finished.is_set():
            await asyncio.sleep(step)
            self.meter.sample()
            since_write += step
            if since_write >= self.record_every:
                since_write = 0.0
                await asyncio.to_thread(self.write)
                self.supervisor.record.save_soon_if_running()

    def finish(self) -> None:
        """At teardown, after the kill and before the cgroup goes: the last figures (nothing
        runs any more; the totals and the peak stay)."""
        self.meter.sample()
        if is_measured(self.meter.usage):  # else they stay "not measured"
            self.meter.usage["memory_bytes"] = 0
            self.meter.usage["processes"] = 0
