"""Claiming the kernel's sandbox: created in the background at start, awaited by the first
cell, replaced when it is gone (the next cell first says plainly what happened and what was
lost: variables, pushed files).

A component of `SandboxLifecycle` (kernel/lifecycle.py): it owns where the server is, the
sandbox, the one being created, the one that went away, and the notebook's binding; the
cells ask it for a sandbox (`ensure`, `current`) and tell it when one is gone (`mark_gone`).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
import typing as t
import uuid
from dataclasses import dataclass, field

from urllib.parse import urlsplit

from sandbox.client import (
    AsyncSandbox,
    InvalidRequest,
    SandboxError,
    SandboxGone,
    SandboxNotFound,
    ServerConfig,
    Unauthorized,
    resolve,
)
from sandbox.common.background import spawn
from sandbox.runtime import vocabulary as V

from . import binding, saved_state
from .cell_output import Output
from .config import SandboxSettings
from .failure import CellFailure
from .keeping import NotebookKeeper, hold as hold_sandbox
from .notes import show_note
from .outputs import gone_notice
from .server import ServerStartError, ensure_server


# Show startup progress in the cell only if the wait is long enough to wonder about.
PROGRESS_AFTER = 3.0


@dataclass
class _Gone:
    sandbox_id: str
    why: str
    pushed: list[str] = field(default_factory=list)


class SandboxClaim:
    """The current sandbox, the one being created, and the one that went away.

    `on_adopt(sandbox)` is called whenever a sandbox becomes the kernel's (the cells reset
    what they knew of the old one)."""

    def __init__(self, settings: SandboxSettings, log: t.Any,
                 on_adopt: t.Callable[[AsyncSandbox], None] = lambda sbx: None) -> None:
        self.settings = settings
        self.log = log
        self.on_adopt = on_adopt
        self.server_config: ServerConfig | None = None
        self.sandbox_id: str | None = None  # known at once, even before a cell adopts it (shutdown reads it)
        self.sandbox_tier = ""  # the isolation backend of the current sandbox (gvisor can pause)
        self.pushed: list[str] = []  # files %push put into the current sandbox
        self.keeper = NotebookKeeper(settings.keep_notebook_sandbox, log)  # the notebook's sandbox (keeping.py)
        self.shutting_down = False
        self.restarting = False  # shutdown for "Restart kernel": the sandbox goes too
        self.creations_in_flight = 0
        self._sandbox: AsyncSandbox | None = None
        self._creating: asyncio.Task | None = None
        self._status = ""
        self._gone: _Gone | None = None
        self._pending_notice: str | None = None
        self._claimed_once = False  # the first claim takes the notebook's kept sandbox back

    @property
    def sandbox(self) -> AsyncSandbox | None:
        """The kernel's sandbox now, if it has one (none while it is created or replaced)."""
        return self._sandbox

    def config(self) -> ServerConfig:
        """Where the server is (sandbox/service/endpoint.py's rule: the configured URL, else the
        state directory's socket) and the token if one is needed. Resolved once."""
        if self.server_config is None:
            s = self.settings
            self.server_config = resolve(s.url, s.token, s.state_dir)
        return self.server_config

    @property
    def embedded(self) -> bool:
        """Whether the kernel looks after the local server itself: by default only when
        no URL is configured (the state directory's own server); `start_server=True` also
        for a configured unix socket or loopback URL."""
        start = self.settings.start_server
        if start is None:
            return not self.settings.url
        config = self.config()
        host = urlsplit(config.url).hostname or ""
        return bool(start) and (bool(config.socket) or host in ("localhost", "::1") or host.startswith("127."))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Claim the sandbox in the background; the first cell awaits it."""
        self._creating = loop.create_task(self._create())
        self._creating.add_done_callback(self._log_creation_failure)

    def _log_creation_failure(self, task: asyncio.Task) -> None:
        # Retrieved here so that asyncio does not print "exception never retrieved"
        # into whichever cell runs next; the first cell reports it properly.
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("creating the sandbox at start failed: %s", task.exception())

    def _set_status(self, text: str) -> None:
        self._status = text

    async def start_server_if_ours(self) -> None:
        if not self.embedded:
            return
        config = self.config()
        started = await asyncio.to_thread(
            ensure_server,
            config.endpoint,
            config.state_dir,
            timeout=self.settings.server_start_timeout,
            on_status=self._set_status,
            idle_seconds=self.settings.server_idle_seconds,
        )
        if started:
            self.log.info("started the sandbox server at %s", config.where)

    async def _create(self) -> AsyncSandbox:
        self.creations_in_flight += 1
        try:
            config = self.config()
            await self.start_server_if_ours()
            sbx = await self._reattach(config)
            if sbx is None:
                sbx = await self._create_new(config)
            # Known to shutdown at once, even before a cell adopts it.
            self.sandbox_id = sbx.id
        finally:
            self.creations_in_flight -= 1
        if self.shutting_down:
            # The shutdown went ahead without this sandbox: do not leave it behind (a kept
            # one stays the notebook's, as the shutdown would have left it).
            if not self.keeper.keeping or self.restarting:
                await sbx.delete()
            await sbx.close()
            raise CellFailure("KernelShutdown", "the kernel is shutting down")
        return sbx

    async def _reattach(self, config: ServerConfig) -> AsyncSandbox | None:
        """The notebook's kept sandbox, at the kernel's first claim only (a replacement for
        a sandbox that went away is a new one)."""
        if self._claimed_once:
            return None
        self._claimed_once = True
        self.keeper.take(config, self.settings.isolation)
        if not self.keeper.keeping:
            return None
        self._set_status("taking back this notebook's sandbox")
        sbx = await self.keeper.reattach(config)
        if sbx is not None:
            self.log.info("sandbox %s: this notebook's, taken back", sbx.id)
        return sbx

    async def _create_new(self, config: ServerConfig) -> AsyncSandbox:
        self._set_status("creating the sandbox")
        keeping = self.keeper.keeping
        from_save = await saved_state.to_restore(self.keeper, config)
        if from_save:
            self._set_status("creating the sandbox and loading this notebook's saved variables")
        sbx = await AsyncSandbox.create(
            **self.settings.create_arguments(),
            metadata={"client": "sandbox-kernel", "kernel_pid": os.getpid(), **saved_state.metadata(self.keeper)},
            from_save=from_save,
            config=config,
            # Over the socket the server ends the sandbox when this process exits, even if
            # it is killed without a shutdown (nbval, kill -9); unless the notebook keeps
            # it, for its next kernel: then its TTL ends it if no kernel comes back.
            end_with_caller=True if config.socket and not keeping else None,
            # A kept gVisor sandbox sleeps on disk when idle instead of ending.
            on_idle=V.ON_IDLE_PAUSE if keeping and self.settings.isolation == V.GVISOR else None,
        )
        self.keeper.bind(sbx)
        if sbx.info.restored is not None:
            self.keeper.note = (self.keeper.note or "") + saved_state.restored_note(sbx.info.restored)
        await hold_sandbox(sbx, config)  # a new sandbox is free: this only tells the server it is ours
        self.log.info("sandbox %s (%s)", sbx.id, "warm pool" if sbx.info.from_pool else "cold start")
        return sbx

    def _adopt(self, sbx: AsyncSandbox) -> None:
        self._sandbox = sbx
        self.sandbox_id = sbx.id
        self.sandbox_tier = str((sbx.info.isolation or {}).get("backend") or "")
        self.on_adopt(sbx)
        gone, self._gone = self._gone, None
        if gone is not None:
            self._pending_notice = gone_notice(gone.sandbox_id, gone.why, gone.pushed, sbx.id)
        else:
            self._pending_notice = self.keeper.take_note() or self._pending_notice

    async def _await_creation(self, task: asyncio.Task, out: Output) -> AsyncSandbox:
        """Wait for a sandbox being created, showing in the cell what takes long (the
        first start of the server builds the image: minutes)."""
        began = time.monotonic()
        display_id = f"sandbox-startup-{uuid.uuid4().hex}"
        shown = False
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            elapsed = time.monotonic() - began
            if not task.done() and elapsed >= PROGRESS_AFTER:
                text = f"{self._status or 'creating the sandbox'} … {elapsed:.0f} s"
                out.display({"text/plain": text}, display_id=display_id, update=shown)
                shown = True
        if shown:
            # Progress is not output: leave no trace in the saved notebook (nbval would
            # see an extra output). Nothing else has been shown in the cell yet but a
            # "retrying" notice that the wait has made obsolete.
            out.send("clear_output", {"wait": False})
        return task.result()

    async def ensure(self, out: Output) -> AsyncSandbox:
        """The sandbox for this cell: the current one, the one being created (at start, or
        for a cell that was interrupted while waiting), or a new one.

        A creation is a task of its own, not part of the cell: interrupting a cell that
        waits for the server leaves the creation going, for the next cell to pick up.
        """
        if self._sandbox is None or self._gone is not None:
            if self._creating is None:
                self._creating = asyncio.get_running_loop().create_task(self._create())
            task = self._creating
            try:
                sbx = await self._await_creation(task, out)
            except ServerStartError as exc:
                raise CellFailure("ServerUnavailable", str(exc)) from None
            except Unauthorized as exc:
                raise CellFailure("Unauthorized", exc.message) from None
            except InvalidRequest as exc:
                raise CellFailure(
                    "InvalidRequest", f"the sandbox server refused to create a sandbox: {exc.message}"
                ) from None
            finally:
                if task.done() and self._creating is task:
                    self._creating = None
            self._adopt(sbx)
        if self._pending_notice and not out.silent:
            # Told in the first cell that shows output, once.
            show_note(out, self._pending_notice)
            self._pending_notice = None
        return t.cast(AsyncSandbox, self._sandbox)

    async def current(self) -> AsyncSandbox | None:
        """The sandbox if there is one to ask, without starting a creation: completion
        should never be what starts a sandbox. A creation under way is awaited."""
        if self._creating is not None:
            task = self._creating
            try:
                sbx = await asyncio.wait_for(asyncio.shield(task), timeout=30.0)
            except (asyncio.TimeoutError, SandboxError, CellFailure, ServerStartError, OSError):
                return None
            finally:
                if task.done() and self._creating is task:
                    self._creating = None
            if self._sandbox is not sbx:
                self._adopt(sbx)
        if self._gone is not None:
            return None
        return self._sandbox

    async def ask(self, call: t.Callable[[AsyncSandbox], t.Awaitable[dict[str, t.Any]]]) -> dict[str, t.Any] | None:
        """A quick question to the sandbox (completion, inspection); None if it cannot answer."""
        sbx = await self.current()
        if sbx is None:
            return None
        try:
            return await call(sbx)
        except (SandboxGone, SandboxNotFound) as exc:
            self.mark_gone(exc.message)
        except SandboxError as exc:
            self.log.warning("sandbox request failed: %s", exc)
        return None

    def mark_gone(self, why: str) -> None:
        """Forget the sandbox; the next cell gets a new one and hears why."""
        old = self._sandbox
        if old is None:
            return
        self._gone = _Gone(old.id, why, list(self.pushed))
        self.pushed = []
        self._sandbox = None
        self.sandbox_id = None
        spawn(self._discard(old))

    # ------------------------------------------------------------------ by hand (%sandbox)

    async def start_fresh(self) -> tuple[str | None, AsyncSandbox]:
        """`%sandbox new`: a new sandbox for this kernel (and its notebook); the old one is
        deleted, as on Restart kernel. (old id, new sandbox)."""
        old = self._sandbox
        sbx = await self._create_new(self.config())
        self.pushed = []
        self._adopt(sbx)
        if old is not None:
            await self._discard(old)
        return (old.id if old is not None else None), sbx

    async def attach(self, sandbox_id: str) -> tuple[str | None, AsyncSandbox, list[str]]:
        """`%sandbox attach ID`: this kernel (and its notebook) takes sandbox ID, resumed if
        paused; the one it leaves is kept until its TTL. Refused while another notebook's
        live kernel holds ID. (old id, the sandbox, notebooks it was taken from)."""
        config = self.config()
        if sandbox_id == self.sandbox_id:
            raise CellFailure("UsageError", f"%sandbox attach: {sandbox_id} is this kernel's sandbox already")
        own = self.keeper.lease.path if self.keeper.lease is not None else None
        _check_attachable(config, sandbox_id, own)
        try:
            sbx = await AsyncSandbox.connect(sandbox_id, config=config)
        except (SandboxGone, SandboxNotFound) as exc:  # about that id, not about this kernel's sandbox
            raise CellFailure(type(exc).__name__, f"%sandbox attach: {exc.message}") from None
        refused = await hold_sandbox(sbx, config)  # the server's word: another user state's kernel counts too
        if refused is not None:
            await sbx.close()
            raise CellFailure("SandboxInUse", f"%sandbox attach: {refused}")
        if sbx.info.state == V.PAUSED:
            await sbx.resume()
        old = self._sandbox
        self.pushed = []
        self._adopt(sbx)
        self.keeper.bind(sbx)
        # It leaves the notebook it was kept for, whose next kernel must not take it too.
        moved = binding.unbind_elsewhere(config.state_dir, sandbox_id, own)
        if old is not None:
            await old.close()  # not deleted: `%sandbox attach` takes it back until its TTL ends it
        return (old.id if old is not None else None), sbx, moved

    async def _discard(self, sbx: AsyncSandbox) -> None:
        # A dead sandbox may hold resources on the server until deleted; deleting one
        # that already expired or was deleted is a no-op.
        try:
            await sbx.delete()
        except SandboxError as exc:
            self.log.debug("could not delete gone sandbox %s: %s", sbx.id, exc)
        finally:
            await sbx.close()


def _check_attachable(config: ServerConfig, sandbox_id: str, own: pathlib.Path | None) -> None:
    """`%sandbox attach`'s checks before it asks the server: no other notebook of this state
    directory holds the id (the server then checks every live kernel), and it is an id at all."""
    holder = binding.holder_of(config.state_dir, sandbox_id, own)
    if holder is not None:
        raise CellFailure("SandboxInUse", f"%sandbox attach: {sandbox_id} is in use by the kernel of {holder}; "
                          "shut that kernel down first (two kernels never share a sandbox)")
    if not binding.SANDBOX_ID.match(sandbox_id):
        raise CellFailure("UsageError", f"%sandbox attach: {sandbox_id!r} is not a sandbox id (%sandbox list shows them)")
