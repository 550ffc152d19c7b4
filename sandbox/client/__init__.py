"""Python client for the sandbox service.

The kernel uses it, and so can agents that have no use for Jupyter::

    from sandbox.client import Sandbox

    with Sandbox.create() as sbx:
        sbx.files.write("data.csv", pathlib.Path("local.csv"))
        execution = sbx.run_code("import pandas as pd; pd.read_csv('data.csv').shape")
        print(execution.text)

`Sandbox` and `AsyncSandbox` have the same surface, because one is generated from the
other: the async client (async_client.py) is the source, the sync client (sync_client.py)
is written from it by scripts/unasync.py. The async one awaits where the sync one blocks,
and its callbacks may be coroutine functions. An `AsyncSandbox` belongs to the event loop it
is first used on (httpx's connection pool does): another thread with its own loop should
attach its own instance.

Every failure the server reports arrives as a `SandboxError` subclass carrying the
server's own message (errors.py). Which server: the one of the state directory (its unix
socket), unless a URL is given (configuration.py). What the server answers: models.py.
`list_sandboxes`, `list_saves`, `delete_save`, `health` and `server_info` here are the blocking ones; the awaitable
ones are in sandbox.client.async_client.
"""

from __future__ import annotations

from .async_client import AsyncCommands, AsyncFiles, AsyncSandbox, AsyncSaves
from .configuration import DEFAULT_TIMEOUT, ServerConfig, default_state_dir, resolve
from .errors import (
    InvalidRequest,
    SandboxError,
    SandboxGone,
    SandboxNotFound,
    ServerUnavailable,
    Unauthorized,
)
from .models import CommandResult, Execution, ExecutionError, FileInfo, FileList, Limits, SandboxInfo
from .sync_client import Commands, Files, Sandbox, Saves, delete_save, health, list_sandboxes, list_saves, server_info

__all__ = [
    "AsyncCommands",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSaves",
    "CommandResult",
    "Commands",
    "DEFAULT_TIMEOUT",
    "Execution",
    "ExecutionError",
    "FileInfo",
    "FileList",
    "Files",
    "InvalidRequest",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxInfo",
    "SandboxNotFound",
    "Saves",
    "ServerConfig",
    "ServerUnavailable",
    "Unauthorized",
    "default_state_dir",
    "delete_save",
    "health",
    "list_sandboxes",
    "list_saves",
    "resolve",
    "server_info",
]
