"""The registry of sandboxes: the live ones, the ended ones (tombstones) and the moves between.

One owner for the question "is this sandbox still there?": a sandbox is live while its
supervisor runs (or while it rests paused, its checkpoint on disk); it is filed as ended,
and what it held of the host released, once its supervisor exited or recorded an ended
state. Every other part asks here, and answers a client's request for an ended sandbox
with the same 410.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import time

from ..common import statefile
from ..egress.service import EgressService
from ..common.errors import ApiError
from .handles import Handle, pid_is_supervisor
from ..isolation import host
from ..isolation.host import HostResources
from ..runtime import vocabulary as V
from .tenancy import Tenancy
from ..usage import store as usage_store

log = logging.getLogger("sandbox.core.manager")


class Registry:
    def __init__(self, egress: EgressService, tenancy: Tenancy, usage: usage_store.UsageStore):
        self.egress = egress
        self.tenancy = tenancy
        self.usage = usage
        self.live: dict[str, Handle] = {}
        self.ended: dict[str, dict] = {}  # id -> its last record, until its tombstone is removed
        self.reaping: list[subprocess.Popen] = []  # exited supervisors still to be waited for

    def get(self, sandbox_id: str) -> Handle:
        """A client's sandbox: 404 for unknown and pooled ids, 410 for ended ones."""
        handle = self.live.get(sandbox_id)
        if handle is not None:
            self.check(handle)
            handle = self.live.get(sandbox_id)
        if handle is None or handle.record.get("state") == V.POOLED:
            if sandbox_id in self.ended:
                raise self.gone_error(sandbox_id)
            raise self.not_found(sandbox_id)
        return handle

    def claimed(self) -> list[Handle]:
        """The live sandboxes that are somebody's (not the warm pool's), each checked first."""
        for handle in list(self.live.values()):
            self.check(handle)
        return [h for h in self.live.values() if h.record.get("state") != V.POOLED]

    @staticmethod
    def not_found(sandbox_id: str) -> ApiError:
        """Also the answer to a tenant asking for another's sandbox: ids do not leak."""
        return ApiError(404, "not_found", f"no sandbox with id {sandbox_id!r}")

    def gone_error(self, sandbox_id: str) -> ApiError:
        record = self.ended[sandbox_id]
        ended_as = record.get("state", V.DEAD)
        why = record.get("dead_message") or record.get("end_message") or ""
        text = {V.EXPIRED: f"sandbox {sandbox_id} expired", V.DELETED: f"sandbox {sandbox_id} was deleted",
                V.LOST: f"sandbox {sandbox_id} was lost", V.DEAD: f"sandbox {sandbox_id} died"}.get(ended_as, ended_as)
        return ApiError(410, "gone", f"{text}: {why}" if why else text,
                        extra={"state": ended_as, "reason": record.get("dead_reason") or ended_as,
                               "ended_at": statefile.iso(record.get("ended_at"))})

    def check(self, handle: Handle) -> None:
        """Move a sandbox that has ended from the live registry to the ended one.

        Ended means its supervisor exited, or recorded an ended state and is tearing down
        (its exit is then reaped later, so a request right after a death already gets 410).
        """
        alive = handle.supervisor_alive()
        record = handle.saved_record()
        if alive and record.get("state") not in V.ENDED_STATES:
            return
        if record.get("state") == V.PAUSED:  # its supervisor exited after the checkpoint, as it should
            if alive and handle.process is not None:
                self.reaping.append(handle.process)
            handle.record, handle.process = record, None
            handle.drop_idle()
            return
        if alive and handle.process is not None:
            self.reaping.append(handle.process)
        if record.get("state") not in V.ENDED_STATES:
            V.advance(record, V.DEAD, dead_reason=record.get("dead_reason") or V.CRASHED,
                      dead_message=record.get("dead_message") or "its supervisor process ended unexpectedly")
        # Its supervisor stamps ended_at when its teardown is done; a 410 before that says
        # when the server saw it end.
        record.setdefault("ended_at", statefile.iso(time.time()))
        self.live.pop(handle.id, None)
        handle.drop_idle()
        self.bury(handle.id, record, handle.dir)

    def bury(self, sandbox_id: str, record: dict, d: str) -> None:
        """File a sandbox as ended and release what it held of the host."""
        self.ended[sandbox_id] = record
        self._record_usage(sandbox_id, record)
        self.egress.close(sandbox_id)
        self.tenancy.unwatch(sandbox_id)
        # What a killed supervisor left (its cgroup, its workspace's mount); the workspaces of
        # ended sandboxes are removed, the small state file stays as a tombstone.
        HostResources.left_behind(d, record).release()
        shutil.rmtree(host.workspace_dir(d), ignore_errors=True)

    def _record_usage(self, sandbox_id: str, record: dict) -> None:
        """Complete an ended sandbox's usage record: its egress (counted here), and the row
        itself when its supervisor could not write its last (see usage/store.py)."""
        try:
            usage_store.complete(self.usage, record, usage_store.owner_name(self.tenancy.owner_of(sandbox_id)),
                                 statefile.iso(time.time()))
            egress = self.egress.describe(sandbox_id)
            if egress is not None:
                usage_store.add_egress(self.usage, sandbox_id, egress["usage"])
        except Exception:  # sqlite3.Error, OSError: reported; the sandbox is buried all the same
            log.exception("could not complete the usage record of %s", sandbox_id)

    def forget(self, sandbox_id: str) -> None:
        """Drop an ended sandbox's tombstone (its directory is gone or being removed)."""
        self.ended.pop(sandbox_id, None)
        self.tenancy.forget(sandbox_id)

    async def wait_for_exit(self, handle: Handle, timeout: float = 15.0) -> None:
        """Give an ending supervisor up to ``timeout`` seconds to exit, then file it as
        `check` does. It sleeps on the event loop, never in it: the server keeps
        answering every other request while one sandbox takes its time to go."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while handle.supervisor_alive() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self.check(handle)

    @staticmethod
    def terminate(handle: Handle) -> None:
        """SIGTERM a supervisor that could not be asked (one still starting has no control
        socket yet): to a supervisor it means "end this sandbox", cleanly."""
        if handle.pid and pid_is_supervisor(handle.pid, handle.dir):
            try:
                os.kill(handle.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    @staticmethod
    def force_kill(handle: Handle) -> None:
        """SIGKILL a supervisor that did not end when asked (its sandbox dies with it)."""
        if handle.pid and pid_is_supervisor(handle.pid, handle.dir):
            try:
                os.kill(handle.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
