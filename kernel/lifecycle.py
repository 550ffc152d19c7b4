"""The kernel's sandbox over its life: created at start, used by each cell, replaced when
it is gone, deleted at shutdown.

The kernel holds nothing worth keeping; the sandbox does. What this package adds is
recovery, so that the user never faces a traceback from our code. `SandboxLifecycle` is a
facade over three components, each with its own state and a narrow interface (as
`SandboxManager` is over registry, pool and reaper):

- `SandboxClaim` (claim.py): where the server is and the sandbox: claimed in the background
  while the user types the first cell, a slow start (the first start of the server builds
  the image) shown in the cell, a sandbox that expired, died or was deleted replaced at the
  next cell;
- `CellRunner` (cells.py): the running cell (magics, code, input(), comm messages),
  retrying a server that is briefly away, and the sandbox's count kept to the kernel's;
- `ControlThread` (control.py): interrupt and shutdown, on ipykernel's control thread.

The execution counts and the abort after an error are the kernel's shell queue's
(queue.py), which the cells are given.

Threads: cells run on the main thread's event loop; interrupt and shutdown arrive on
ipykernel's control thread, with its own loop (see control.py).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import typing as t

from sandbox.client import AsyncSandbox

from . import output_mode
from .cell_output import Output
from .cells import CellRunner
from .claim import SandboxClaim
from .config import SandboxSettings
from .control import ControlThread
from .queue import ExecutionCounts

__all__ = ["Output", "SandboxLifecycle"]


class SandboxLifecycle:
    def __init__(self, settings: SandboxSettings, log: t.Any, cwd: pathlib.Path | None = None,
                 counts: ExecutionCounts | None = None) -> None:
        self.settings = settings
        self.cwd = cwd or pathlib.Path.cwd()
        self.airlock_root = pathlib.Path(os.path.expanduser(settings.airlock_root)) if settings.airlock_root else self.cwd
        self.claim = SandboxClaim(settings, log)
        self.cells = CellRunner(self.claim, counts or ExecutionCounts(), settings, log, self.cwd, self.airlock_root)
        self.claim.on_adopt = self.cells.adopted
        self.control = ControlThread(self.claim, self.cells, log)

    # ---------------------------------------------------------------- the kernel's calls

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.claim.start(loop)

    async def run_cell(self, code: str, silent: bool, store_history: bool, out: Output) -> asyncio.Task:
        return await self.cells.run_cell(code, silent, store_history, out)

    async def run_comm(self, msg_type: str, content: dict[str, t.Any], metadata: dict[str, t.Any],
                       buffers: list[bytes], out: Output) -> None:
        await self.cells.run_comm(msg_type, content, metadata, buffers, out)

    async def ask(self, call: t.Callable[[AsyncSandbox], t.Awaitable[dict[str, t.Any]]]) -> dict[str, t.Any] | None:
        return await self.claim.ask(call)

    async def interrupt(self) -> None:
        await self.control.interrupt()

    async def shutdown(self, restart: bool = False) -> None:
        await self.control.shutdown(restart)

    def on_terminate(self) -> None:
        self.control.on_terminate()

    @property
    def outputs_passthrough(self) -> bool:
        return output_mode.passthrough(self.settings)

    @property
    def outputs_mode(self) -> str:
        return output_mode.describe(self.settings)
