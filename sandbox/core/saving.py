"""Saving a sandbox's namespace by value, and loading it into another: the host's part.

The runtime pickles its namespace into a file under its own ``/workspace`` (runtime/saving.py,
bounded by the size this owner may still save and by ``save_seconds``). The host then copies
that file's bytes, through the workspace's confined, link-refusing reads (core/files.py), into
the owner's store (core/saves.py), and removes it from the workspace. A restore copies the
bytes into the new sandbox's workspace and asks *its* runtime to load them: no host process
ever unpickles what a sandbox wrote.
"""

from __future__ import annotations

import asyncio
import os
import secrets

from ..common.errors import ApiError
from ..isolation import host
from . import saves
from .config import MiB, ServiceConfig
from .files import CHUNK, Workspace
from .handles import Handle
from .supervisor_calls import SupervisorCalls

#: Where, under /workspace, a save is written and a restore is read (hidden; removed after).
SAVE_DIR = ".sandbox-state"
TRAILER_SLACK = 1 * MiB  # the save file's trailer (names and sizes) beyond the data's cap
CALL_SLACK = 30.0  # seconds a save's request may take beyond its own bound


class StateSaving:
    def __init__(self, config: ServiceConfig, store: saves.SaveStore, calls: SupervisorCalls):
        self.config, self.store, self.calls = config, store, calls

    def _workspace(self, handle: Handle, max_bytes: int) -> Workspace:
        return Workspace(host.workspace_dir(handle.dir), handle.uid, max_bytes, self.config.file_delete_seconds)

    async def save(self, handle: Handle, owner: int | None, label: str | None = None, by: str = "request") -> dict:
        """Save ``handle``'s namespace into ``owner``'s store; 409 save_refused (nothing lost,
        the sandbox as it was) past the per-save cap, the owner's room or the time bound."""
        room = self.store.room(owner)
        cap = min(self.config.save_max_mb * MiB, room)
        if cap <= 0:
            raise ApiError(409, "save_refused", f"your saves already use their {self.config.saves_max_mb} MiB cap "
                           "(saves_max_mb); delete one (DELETE /v1/saves/ID) and save again; nothing else was touched")
        name = f"{SAVE_DIR}/save-{secrets.token_hex(6)}.bin"
        seconds = self.config.save_seconds
        reply = await self.calls.call(handle, {"op": "save", "path": name, "max_bytes": cap, "seconds": seconds,
                                               "timeout": seconds + CALL_SLACK}, timeout=seconds + 2 * CALL_SLACK)
        if reply.get("refused"):
            which = "your room left in saves_max_mb" if cap == room else "save_max_mb"
            raise ApiError(409, "save_refused", f"the save was refused (nothing else was touched): {str(reply['refused'])[:600]}"
                           f" (the cap was {cap} bytes: {which})", extra={"limit": cap})
        workspace = self._workspace(handle, cap + TRAILER_SLACK)
        save_id, partial = self.store.begin(owner)
        try:
            fd, size = await asyncio.to_thread(workspace.open_for_read, name)
            await asyncio.to_thread(_copy_out, fd, size, os.path.join(partial, saves.DATA))
            record = self.store.commit(owner, save_id, partial, {
                "label": label, "owner": owner, "source_sandbox": handle.id, "image": handle.image, "by": by,
                "summary": saves.clean_summary(reply.get("saved_state"))})
            if label:
                self.store.clear_failure(owner, label)
        except BaseException:
            self.store.abandon(partial)
            raise
        finally:
            await asyncio.to_thread(_forget_file, workspace, name)
        return saves.public(record)

    async def restore(self, handle: Handle, owner: int | None, save_id: str) -> dict:
        """Load a save into ``handle``'s namespace, inside that sandbox. The answer says what came
        back, what did not, and how old the save is; a save the sandbox could not load is an
        ``error`` in it (the sandbox stays, as it was)."""
        record = self.store.get(owner, save_id)
        source = self.store.data_path(owner, save_id)
        name = f"{SAVE_DIR}/restore-{secrets.token_hex(6)}.bin"
        workspace = self._workspace(handle, int(record.get("bytes") or 0) + 1)
        await workspace.write(name, _read_chunks(source))
        try:
            reply = await self.calls.call(handle, {"op": "restore", "path": name, "timeout": self.config.save_seconds},
                                          timeout=self.config.save_seconds + CALL_SLACK)
        finally:
            await asyncio.to_thread(_forget_file, workspace, name)
        out = {"save": saves.public(record), **saves.clean_summary(reply.get("saved_state"))}
        if reply.get("refused"):
            out["error"] = str(reply["refused"])[:600]
        return out


def _copy_out(fd: int, size: int, target: str) -> None:
    """The first ``size`` bytes of a workspace file into the store (0600, owned by the server)."""
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        left = size
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    finally:
        os.close(out)
        os.close(fd)


async def _read_chunks(path: str):
    with open(path, "rb") as f:
        while True:
            chunk = await asyncio.to_thread(f.read, CHUNK)
            if not chunk:
                return
            yield chunk


def _forget_file(workspace: Workspace, name: str) -> None:
    try:
        workspace.delete(name)
    except ApiError:
        pass  # already gone (the sandbox removed it, or the save was refused before writing)
