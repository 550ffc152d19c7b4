"""What arrives on ipykernel's control thread: interrupt and shutdown.

That thread has its own event loop, and an httpx client belongs to one loop, so these
methods attach short-lived clients of their own and read only plain attributes: the
claim's `sandbox_id` and `server_config`, the cells' running `cell` and comms in flight. A
component of `SandboxLifecycle` (kernel/lifecycle.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import typing as t

import httpx

from sandbox.client import AsyncSandbox, SandboxError
from sandbox.runtime import vocabulary as V

from .cells import CellRunner
from .claim import SandboxClaim

CONTROL_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
# Jupyter waits 5 s (shutdown_wait_time) for a kernel to end after its shutdown reply.
PAUSE_WAIT = 4.0


class ControlThread:
    """Interrupting the running cell, and deleting the sandbox at shutdown."""

    def __init__(self, claim: SandboxClaim, cells: CellRunner, log: t.Any) -> None:
        self.claim, self.cells, self.log = claim, cells, log

    async def interrupt(self) -> None:
        """Interrupt the running cell: in the sandbox if the code runs there, else the
        kernel's own part of it (waiting for the server, uploading a file)."""
        cell = self.cells.cell
        if cell is None:
            if self.cells.comms_in_flight:
                await self._interrupt_remote()  # a widget's handler running long
            return
        if cell.waiting is not None:
            cell.loop.call_soon_threadsafe(cell.waiting.cancel)
        sid, config = self.claim.sandbox_id, self.claim.server_config
        if cell.remote and sid and config is not None:
            sbx = AsyncSandbox(sid, config=config, timeout=CONTROL_TIMEOUT)
            try:
                deadline = time.monotonic() + 3.0
                # The execute request may not have reached the sandbox's runtime yet
                # ("nothing running"): try again briefly rather than lose the interrupt.
                while cell is self.cells.cell and cell.remote:
                    try:
                        if await sbx.interrupt():
                            return
                    except SandboxError as exc:
                        self.log.warning("interrupt via the server failed: %s", exc)
                        break
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
                else:
                    return
            finally:
                await sbx.close()
        # Cancelling the cell also closes its execute stream, which makes the server
        # interrupt the cell: the fallback when the interrupt call did not get through.
        cell.loop.call_soon_threadsafe(cell.task.cancel)

    async def _interrupt_remote(self) -> None:
        async with self._control_client() as sbx:
            if sbx is not None:
                try:
                    await sbx.interrupt()
                except SandboxError as exc:
                    self.log.warning("interrupt via the server failed: %s", exc)

    @contextlib.asynccontextmanager
    async def _control_client(self) -> t.AsyncIterator[AsyncSandbox | None]:
        """A client of its own for the control thread (see the module's docstring), closed
        after use, never deleting the sandbox; None when there is no sandbox."""
        sid, config = self.claim.sandbox_id, self.claim.server_config
        if not sid or config is None:
            yield None
            return
        sbx = AsyncSandbox(sid, config=config, timeout=CONTROL_TIMEOUT)
        try:
            yield sbx
        finally:
            await sbx.close()

    async def shutdown(self, restart: bool = False) -> None:
        """End the kernel's hold on its sandbox, including one still being created: a
        notebook's sandbox is kept (paused where the tier can pause; see keeping.py) unless
        this is "Restart kernel"; any other is deleted."""
        claim = self.claim
        claim.restarting = restart
        claim.shutting_down = True
        deadline = time.monotonic() + 10.0
        while claim.creations_in_flight and claim.sandbox_id is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if claim.keeper.keeping and not restart:
            await self._keep()
            return
        claim.keeper.forget()
        async with self._control_client() as sbx:
            if sbx is None:
                return
            try:
                await sbx.delete()
            except SandboxError as exc:
                self.log.warning("could not delete sandbox %s: %s", sbx.id, exc)
        claim.sandbox_id = None

    async def _keep(self) -> None:
        """Leave the notebook's sandbox for its next kernel: a gVisor one is paused (its
        memory goes to disk); a bwrap one runs on until its TTL. A pause that does not
        finish before Jupyter stops waiting for the kernel goes on in the server, and the
        sandbox's own idle TTL pauses it otherwise (it was created with on_idle: pause)."""
        if self.claim.sandbox_tier != V.GVISOR:
            return
        async with self._control_client() as sbx:
            if sbx is None:
                return
            try:
                await asyncio.wait_for(sbx.pause(), timeout=PAUSE_WAIT)
            except (SandboxError, asyncio.TimeoutError) as exc:
                self.log.warning("sandbox %s not paused now (its idle TTL will): %s", sbx.id, exc)

    def on_terminate(self) -> None:
        """SIGTERM (Jupyter's fallback when a shutdown goes unanswered, or a server stopping):
        a notebook's sandbox is kept for its next kernel, any other deleted at once."""
        if not (self.claim.keeper.keeping and not self.claim.restarting):
            self.delete_now()

    def delete_now(self) -> None:
        """Blocking delete for a signal handler, where no event loop can be relied on."""
        sid, config = self.claim.sandbox_id, self.claim.server_config
        if not sid or config is None:
            return
        try:
            with httpx.Client(transport=config.endpoint.transport(), headers=config.headers, timeout=3.0) as client:
                client.delete(f"{config.endpoint.base_url}/v1/sandboxes/{sid}")
        except httpx.HTTPError:
            pass
        self.claim.sandbox_id = None
