"""A notebook keeps its sandbox: the kernel of a notebook takes back the sandbox its last
kernel left (resuming it if it was paused), and leaves it behind when it ends, except on
"Restart kernel", which means a fresh interpreter in every Jupyter kernel.

| the user                                  | the sandbox                                              |
|-------------------------------------------|----------------------------------------------------------|
| opens the notebook                        | the one it had, if still alive or paused; else a new one |
| shuts the kernel down, closes JupyterLab, | kept: paused (gVisor tier) or left to its sliding TTL    |
| or the server culls the idle kernel       |                                                          |
| restarts the kernel                       | deleted; the new kernel gets a new one                   |
| comes back after the sandbox ended        | a note saying when and why, and a new one                |

Which notebook a kernel serves, and whether another live kernel serves it already, is
kernel/binding.py's. The sandbox's own lifetime rules stay the server's: its TTL, its hard
cap and the user's capacity apply to a kept sandbox as to any.
"""

from __future__ import annotations

import time
import typing as t
from datetime import datetime

from sandbox.client import AsyncSandbox, SandboxError, SandboxGone, SandboxNotFound, ServerConfig
from sandbox.client.async_client import hold as hold_on_server
from sandbox.runtime import vocabulary as V

from .binding import NotebookLease, notebook_from_env
from . import saved_state
from .outputs import format_duration

FRESH_HINT = "for a fresh one: %sandbox new, or Restart kernel"
KEEPING_OFF_NOTE = ("this notebook does not keep its sandbox (SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX=0 here): it is "
                    "deleted when this kernel ends, with its variables and files\n")


def not_kept_note(where: t.Any, exc: OSError) -> str:
    """What a notebook hears when its binding cannot be recorded: its sandbox will not be kept."""
    why = exc.strerror or str(exc)
    return (f"this notebook cannot keep its sandbox: its record in {where} cannot be written ({why}); the sandbox "
            "is deleted when this kernel ends, with its variables and files\n")


def _epoch(value: t.Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _ago(epoch: float | None) -> str:
    return f" {format_duration(max(0.0, time.time() - epoch))} ago" if epoch else ""


def life_left(info: t.Any) -> str:
    """How long a sandbox may still live, in words: its idle TTL and its hard cap."""
    parts = []
    if info.state == V.PAUSED:
        parts.append("paused on disk")
    else:
        left = info.ttl_left()
        if left is not None:
            parts.append(f"{format_duration(left)} idle left (each cell renews it)")
    cap = _epoch(info.max_expires_at)
    if cap is not None:
        parts.append(f"at most {format_duration(max(0.0, cap - time.time()))} more")
    return ", ".join(parts) or "as long as the server allows"


def reattached_note(info: t.Any, was_paused: bool) -> str:
    age = _ago(_epoch(info.created_at)).strip()
    how = "resumed from disk" if was_paused else "still running"
    since = f"its state from {age}" if age else "its state of unknown age"
    return (f"this notebook's sandbox {info.id} ({how}; {since}; {life_left(info)}): "
            f"your variables are still there; {FRESH_HINT}\n")


def ended_note(sandbox_id: str, exc: t.Any, cap: str | None) -> str:
    """What a notebook hears when the sandbox it kept ended meanwhile."""
    if isinstance(exc, SandboxGone):
        details = exc.details or {}
        state = str(details.get("state") or "ended")
        why = exc.message.split(": ", 1)[1] if ": " in exc.message else ""
        when = _ago(_epoch(details.get("ended_at")))
        what = f"{state} ({why})" if why else state
        return f"the sandbox of this notebook ({sandbox_id}) ended{when}: {what}; this is a new one\n"
    capped = _epoch(cap)
    if capped is not None and capped <= time.time():
        return (f"the sandbox of this notebook ({sandbox_id}) ended{_ago(capped)}: it reached its maximum "
                "lifetime; this is a new one\n")
    return (f"the sandbox of this notebook ({sandbox_id}) is no longer on the server (ended long ago, or the "
            "server's state was reset); this is a new one\n")


async def hold(sbx: AsyncSandbox, config: ServerConfig) -> str | None:
    """Tell the server this kernel serves `sbx` (over its socket, where it knows our pid): it
    refuses while another live kernel does, whatever our notebook records say (they are one
    user's, in one state directory). The server's refusal, or None. A server without holds
    (an older one), or TCP, holds nothing: the records' own check still applies."""
    if not config.socket:
        return None
    try:
        await hold_on_server(sbx)
    except SandboxError as exc:
        if exc.code == "in_use":
            return exc.message
    return None


class NotebookKeeper:
    """The notebook's side of the kernel's sandbox: re-attach at start, keep at the end."""

    def __init__(self, enabled: bool, log: t.Any) -> None:
        self.notebook = notebook_from_env() if enabled else None
        self.log = log
        self.lease: NotebookLease | None = None
        # said in the first cell that shows output; a notebook whose sandbox will not be
        # kept is told so there, not only in a log its user may never read
        self.note: str | None = KEEPING_OFF_NOTE if not enabled and notebook_from_env() else None
        self.lost_sandbox: str | None = None  # the kept sandbox found gone: its saved state may come back

    @property
    def keeping(self) -> bool:
        """Whether this kernel holds its notebook: its sandbox is kept when the kernel ends."""
        return self.lease is not None and self.lease.held

    def take(self, config: ServerConfig, tier: str | None) -> None:
        """Take the notebook's lease (before the sandbox is claimed); a second kernel on the
        same notebook is told why it has a fresh sandbox of its own."""
        if self.notebook is None or self.lease is not None:
            return
        lease = NotebookLease(config.state_dir, self.notebook, config.url, tier or "")
        try:
            holder = lease.acquire()
        except OSError as exc:
            self.log.warning("cannot record this notebook's sandbox in %s: %s", lease.dir, exc)
            self.note = not_kept_note(lease.dir, exc)
            return
        if holder is not None:
            pid = f" (pid {holder})" if holder else ""
            self.note = (f"another kernel{pid} is using this notebook's sandbox: this kernel has a fresh sandbox "
                         "of its own, deleted when it ends\n")
            return
        self.lease = lease

    async def reattach(self, config: ServerConfig) -> AsyncSandbox | None:
        """The sandbox the notebook kept, running again; None (and a note) if it is gone."""
        binding = self.lease.read() if self.keeping else None  # type: ignore[union-attr]
        if binding is None:
            return None
        try:
            sbx = await AsyncSandbox.connect(binding.sandbox_id, config=config)
        except (SandboxGone, SandboxNotFound) as exc:
            self.note = ended_note(binding.sandbox_id, exc, binding.max_expires_at)
            self.lost_sandbox = binding.sandbox_id
            self.lease.clear()  # type: ignore[union-attr]
            return None
        refused = await hold(sbx, config)
        if refused is not None:
            await sbx.close()
            self.note = f"this notebook's sandbox is not free: {refused}; this kernel has a new one\n"
            return None
        was_paused = sbx.info.state == V.PAUSED
        if was_paused:
            try:
                await sbx.resume()
            except BaseException:
                await sbx.close()
                raise
        self.note = saved_state.woke_by_value_note(sbx.info) or reattached_note(sbx.info, was_paused)
        return sbx

    def bind(self, sbx: AsyncSandbox) -> None:
        """Record `sbx` as the notebook's sandbox (kept only by the lease's holder)."""
        if self.keeping:
            cap = sbx.info.max_expires_at
            try:
                self.lease.write(sbx.id, cap.isoformat() if cap else None)  # type: ignore[union-attr]
            except OSError as exc:
                self.log.warning("cannot record this notebook's sandbox: %s", exc)
                self.note = not_kept_note(self.lease.dir, exc)  # type: ignore[union-attr]
                self.lease.release()  # type: ignore[union-attr]  (not kept: deleted at the end)

    def forget(self) -> None:
        """The notebook's sandbox was deleted (restart, %sandbox new): nothing to take back."""
        if self.keeping:
            self.lease.clear()  # type: ignore[union-attr]

    def take_note(self) -> str | None:
        note, self.note = self.note, None
        return note
