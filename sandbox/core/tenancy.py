"""Who owns each sandbox, and which process it ends with.

- **Owner**: on a shared (``--multi-user``) server, the uid of the user who created the
  sandbox (from the unix socket's peer credentials); None on a per-user server or for a
  token holder. Requests of another tenant are answered as for an unknown id.
- **Scope**: the label a scoped caller (an agent's tools, see scopes.py) gave the sandbox
  it created; None for everyone else's.
- **Link**: a sandbox created with ``end_with_caller`` ends as soon as the process that
  created it exits. The kernel asks for it, so that a kernel killed without a shutdown
  (nbval, a crashed notebook server, ``kill -9``) does not leave its sandbox running until
  its TTL. The server holds a pidfd of that process (the peer pid of the create request,
  known on the unix socket only) and is woken by the kernel when it exits: no heartbeat, no
  polling, no cost per cell. Agents' sandboxes are unaffected unless they ask.

- **Holder**: the live process (a notebook's kernel) that serves the sandbox now. A second
  process's hold is refused while the holder lives, so that two kernels never share one
  sandbox, whatever each believes from its own notebook records (two users' homes, a lost
  record). A process holds one sandbox at a time: a new hold lets go of its previous one.
  Kept in memory only: a holder is a live process of this server's time, and a kernel holds
  again when it takes its sandbox back.

Owners, scopes and links are kept in ``sandboxes/ID/caller.json`` (owned by the server, 0600), so that a
restarted server knows the owners again and re-links each sandbox, or ends it at once if
its process exited while the server was down. A pid alone could have been reused since: the
process's start time is recorded with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import typing as t
from dataclasses import dataclass

from ..common import statefile

log = logging.getLogger("sandbox.core.tenancy")

FILE_NAME = "caller.json"


@dataclass(frozen=True)
class Link:
    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> "Link | None":
        start = process_start_time(pid)
        return None if start is None else cls(pid, start)

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time


def process_start_time(pid: int) -> int | None:
    """The start time of a live, non-zombie process (clock ticks since boot), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class Tenancy:
    def __init__(self) -> None:
        self.owners: dict[str, int | None] = {}
        self.scopes: dict[str, str] = {}
        self._watches: dict[str, int] = {}
        self.holders: dict[str, Link] = {}

    def owner_of(self, sandbox_id: str) -> int | None:
        return self.owners.get(sandbox_id)

    def scope_of(self, sandbox_id: str) -> str | None:
        return self.scopes.get(sandbox_id)

    def label(self, sandbox_id: str, sandbox_dir: str, scope: str) -> None:
        """Label a sandbox just created or forked with its creator's scope, kept beside its owner."""
        self.scopes[sandbox_id] = scope
        path = os.path.join(sandbox_dir, FILE_NAME)
        data = statefile.read_json(path) or {"owner": self.owners.get(sandbox_id)}
        statefile.write_json(path, {**data, "scope": scope}, mode=0o600, durable=False)

    def record(self, sandbox_id: str, sandbox_dir: str, owner: int | None, link: Link | None) -> None:
        self.owners[sandbox_id] = owner
        if owner is None and link is None:
            return  # nothing to remember: the common case costs no write
        data: dict[str, t.Any] = {"owner": owner}
        if link is not None:
            data["end_with"] = {"pid": link.pid, "start_time": link.start_time}
        # Atomic, not fsynced: a power cut ends the sandbox too; a create stays a few ms.
        statefile.write_json(os.path.join(sandbox_dir, FILE_NAME), data, mode=0o600, durable=False)

    def load(self, sandbox_id: str, sandbox_dir: str) -> Link | None:
        """Read what `record` kept; the link, if the sandbox has one."""
        data = statefile.read_json(os.path.join(sandbox_dir, FILE_NAME)) or {}
        owner, scope = data.get("owner"), data.get("scope")
        self.owners[sandbox_id] = owner if isinstance(owner, int) else None
        if isinstance(scope, str):
            self.scopes[sandbox_id] = scope
        end_with = data.get("end_with")
        if isinstance(end_with, dict) and isinstance(end_with.get("pid"), int) and isinstance(end_with.get("start_time"), int):
            return Link(end_with["pid"], end_with["start_time"])
        return None

    def watch(self, sandbox_id: str, link: Link, on_exit: t.Callable[[str, Link], None]) -> None:
        """Call ``on_exit(sandbox_id, link)`` on the running loop when the process exits
        (at once if it already has)."""
        self.unwatch(sandbox_id)
        loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(link.pid)
        except ProcessLookupError:
            loop.call_soon(on_exit, sandbox_id, link)
            return
        if not link.alive():  # exited, or the pid was reused, before the pidfd was taken
            os.close(fd)
            loop.call_soon(on_exit, sandbox_id, link)
            return
        self._watches[sandbox_id] = fd

        def readable() -> None:
            self.unwatch(sandbox_id)
            on_exit(sandbox_id, link)

        loop.add_reader(fd, readable)

    @property
    def watched(self) -> int:
        """How many sandboxes are tied to a caller still alive (a kernel holding its sandbox)."""
        return len(self._watches)

    def unwatch(self, sandbox_id: str) -> None:
        fd = self._watches.pop(sandbox_id, None)
        if fd is not None:
            try:
                asyncio.get_running_loop().remove_reader(fd)
            except RuntimeError:
                pass
            os.close(fd)

    def hold(self, sandbox_id: str, pid: int) -> int | None:
        """Make process `pid` the sandbox's holder (letting go of any other it held); the
        pid of the live process that holds it already, if another (then nothing changes)."""
        current = self.holders.get(sandbox_id)
        if current is not None and current.pid != pid and current.alive():
            return current.pid
        link = Link.of(pid)
        for other in [sid for sid, held in self.holders.items() if held.pid == pid]:
            del self.holders[other]
        if link is not None:
            self.holders[sandbox_id] = link
        return None

    def forget(self, sandbox_id: str) -> None:
        self.unwatch(sandbox_id)
        self.holders.pop(sandbox_id, None)
        self.owners.pop(sandbox_id, None)
        self.scopes.pop(sandbox_id, None)

    def close(self) -> None:
        for sandbox_id in list(self._watches):
            self.unwatch(sandbox_id)
