"""The kernel's sandbox over its life: created at start, used by each cell, replaced when
it is gone, deleted at shutdown.

The kernel holds nothing worth keeping; the sandbox does. What this package adds is
recovery, so that the user never faces a traceback from our code. One job a module:

- claim.py: the sandbox is claimed in the background while the user types the first cell,
  a slow start (the first start of the server builds the image) shows progress in the
  cell, and a sandbox that expired, died or was deleted is replaced at the next cell;
- cells.py: the running cell (magics, code, input(), comm messages), and retrying a server
  that is briefly away;
- control.py: interrupt and shutdown, on ipykernel's control thread.

Threads: cells run on the main thread's event loop; interrupt and shutdown arrive on
ipykernel's control thread, with its own loop (see control.py).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import typing as t
from urllib.parse import urlsplit

from sandbox.client import AsyncSandbox, ServerConfig, resolve

from .cells import CellRunner, Output, _Cell
from .claim import SandboxClaim, _Gone
from .config import SandboxSettings
from .control import ControlThread
from .host import HostNamespace, host_cells_enabled
from .keeping import NotebookKeeper
from .queue import ExecutionCounts
from .widgets import CommRelay

__all__ = ["Output", "SandboxLifecycle"]


class SandboxLifecycle(SandboxClaim, CellRunner, ControlThread):
    def __init__(self, settings: SandboxSettings, log: t.Any, cwd: pathlib.Path | None = None,
                 counts: ExecutionCounts | None = None) -> None:
        self.settings = settings
        self.log = log
        self.cwd = cwd or pathlib.Path.cwd()
        self.airlock_root = pathlib.Path(os.path.expanduser(settings.airlock_root)) if settings.airlock_root else self.cwd
        self.server_config: ServerConfig | None = None
        self.sandbox_id: str | None = None
        self.pushed: list[str] = []
        self.host_cells = HostNamespace()
        self.counts = counts or ExecutionCounts()  # the kernel's (kernel/queue.py)
        self.sandbox_next: int | None = None  # the count the sandbox's IPython gives its next cell, if known
        self._cell: _Cell | None = None
        self.shutting_down = False
        self._sandbox: AsyncSandbox | None = None
        self._creating: asyncio.Task | None = None
        self._creations_in_flight = 0
        self._status = ""
        self._gone: _Gone | None = None
        self._pending_notice: str | None = None
        self.comms = CommRelay(self.outputs_passthrough)
        self.comms_in_flight = 0  # comm messages from the page the sandbox is handling
        self.keeper = NotebookKeeper(settings.keep_notebook_sandbox, log)  # the notebook's sandbox (keeping.py)
        self._claimed_once = False  # the first claim takes the notebook's kept sandbox back
        self.restarting = False  # shutdown for "Restart kernel": the sandbox goes too
        self.sandbox_tier = ""  # the isolation backend of the current sandbox (gvisor can pause)

    def config(self) -> ServerConfig:
        """Where the server is (sandbox/service/endpoint.py's rule: the configured URL, else the
        state directory's socket) and the token if one is needed. Resolved once."""
        if self.server_config is None:
            s = self.settings
            self.server_config = resolve(s.url, s.token, s.state_dir)
        return self.server_config

    @property
    def outputs_passthrough(self) -> bool:
        """Whether outputs skip the output policy: only if the user asked for it and host
        cells are on (off means cells may be written by something other than the user)."""
        return bool(self.settings.unsafe_trust_sandbox_outputs) and host_cells_enabled()

    @property
    def outputs_mode(self) -> str:
        """What `%sandbox` says about outputs."""
        if self.outputs_passthrough:
            return "UNFILTERED: HTML and JavaScript run in this page with your rights (unsafe_trust_sandbox_outputs)"
        mode = "isolated: HTML/JS/SVG/Markdown in sandboxed frames, images checked, metadata filtered"
        if self.settings.unsafe_trust_sandbox_outputs:
            mode += " (pass-through ignored: host cells are off)"
        return mode

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
