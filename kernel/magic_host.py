"""What every kernel magic shares: how a call looks once parsed, what the kernel offers a
magic while it runs (`MagicHost`), and the usage line of each magic."""

from __future__ import annotations

import pathlib
import typing as t
from dataclasses import dataclass

from sandbox.client import AsyncSandbox, ServerConfig

HELP = {
    "push": "%push LOCAL [DEST]: upload files (globs like data/*.csv, folders) from the notebook's folder into /workspace",
    "pull": "%pull [--force] [--allow-code] REMOTE [LOCAL]: download files (globs like out/*.png) from /workspace "
    "into the notebook's folder; --force replaces existing files; --allow-code lets through files a host program "
    "would run, import or read as config (*.py, *.pth, dotfiles, Jupyter/IPython config names)",
    "sandbox": "%sandbox: show the sandbox's id, state, TTL, limits, what it uses (memory, CPU, disk), isolation and "
               "egress policy; %sandbox packages: the packages of its image, with versions; %sandbox list: your "
               "sandboxes and the notebooks they belong to; %sandbox new: a fresh sandbox (this one is deleted); "
               "%sandbox attach ID: take sandbox ID (resumed if paused); %sandbox timeout [SECONDS]: show or set how "
               "long a cell may run (execute_timeout); %sandbox save: save the variables by value "
               "(they come back in this notebook's next sandbox once this one ends); %sandbox restore [SAVE_ID]: "
               "load the newest save (or SAVE_ID); %sandbox forget [SAVE_ID]: delete this notebook's saves",
    "ttl": "%ttl: show the time left; %ttl renew: restart the countdown at the current TTL; "
           "%ttl extend SECONDS: expire that far from now, once (the TTL each cell renews to is unchanged); "
           "%ttl set SECONDS: change the TTL each cell renews to",
}


@dataclass(frozen=True)
class MagicCall:
    name: str
    args: list[str]
    line: str


class MagicHost(t.Protocol):
    """What a magic needs from the kernel."""

    cwd: pathlib.Path
    airlock_root: pathlib.Path  # the only host folder %push reads and %pull writes (see airlock)
    pull_max_bytes: int  # what one %pull may write in all, by apparent size
    outputs_mode: str
    pushed: list[str]
    server_url: str

    async def sandbox(self) -> AsyncSandbox: ...

    def stdout(self, text: str) -> None: ...

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None: ...

    async def new_sandbox(self) -> str: ...

    async def attach_sandbox(self, sandbox_id: str) -> str: ...

    async def list_sandboxes(self) -> str: ...

    def cell_timeout(self, seconds: float | None = None) -> float | None:
        """The kernel's execute_timeout (None: the server's default), set first if given."""

    def config(self) -> ServerConfig: ...

    def save_label(self) -> str | None: ...
