"""Launching a sandbox: its backend's process, the channel to it, its first frame.

Every backend shares what is set up here and in ``isolation/host.py`` (the cgroup, the
rlimits, the workspace's filesystem image): the channel's socket pair and the capped
runtime log. The isolation tool itself is the backend's (``sandbox/isolation/backends``).
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass

from ..isolation import testonly
from ..isolation.backends import SOCKET, STDIO, Launch, backend_for
from ..isolation.host import HostResources
from ..common.paths import open_private_log
from ..runtime import framecheck
from ..runtime import vocabulary as V
from ..runtime.protocol import ProtocolError, read_payload

RUNTIME_LOG_BYTES = 1024 * 1024
RUNTIME_READY_TIMEOUT = 180.0


@dataclass
class Launched:
    proc: asyncio.subprocess.Process
    channel: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ready: dict
    log_task: asyncio.Task


async def launch(sandbox_dir: str, spec: dict, host: HostResources, isolation: dict,
                 restore: bool = False) -> Launched:
    """Start the sandbox (its host resources acquired) and wait for its runtime's `ready`;
    the backend completes ``isolation``. ``restore``: bring a paused sandbox back from its
    checkpoint; its runtime was running when it was saved and sends no `ready`.

    Raises RuntimeError saying why (LaunchFailed, with the runtime log's tail, once there
    is a process to end) if it does not start.
    """
    backend = backend_for(spec)
    child_setup = host.child_setup(as_root=getattr(backend, "as_root", False))
    if getattr(backend, "channel", SOCKET) == STDIO:
        plan = Launch(spec=spec, channel_fd=None, child_setup=child_setup, isolation=isolation,
                      sandbox_dir=sandbox_dir, restore=restore)
        proc = await backend.spawn(plan)
        log_task = asyncio.create_task(keep_log(proc.stderr, runtime_log(sandbox_dir)))
        reader, writer = proc.stdout, proc.stdin
    else:
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        plan = Launch(spec=spec, channel_fd=child_sock.fileno(), child_setup=child_setup, isolation=isolation,
                      sandbox_dir=sandbox_dir, restore=restore)
        try:
            proc = await backend.spawn(plan)
        finally:
            # The channel's socket object closes its own fd: an os.close() here would leave the
            # object to close the same number again when it is collected, by then quite
            # possibly the control socket's listener.
            child_sock.close()
        log_task = asyncio.create_task(keep_log(proc.stdout, runtime_log(sandbox_dir)))
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
    isolation.update(testonly.isolation_notes(spec))
    launched = Launched(proc, (reader, writer), {}, log_task)
    if restore:
        return launched
    try:
        ready = framecheck.load(await asyncio.wait_for(read_payload(reader, framecheck.FRAME_SLACK),
                                                       RUNTIME_READY_TIMEOUT))
    except (EOFError, asyncio.TimeoutError, ProtocolError) as exc:
        code = await exit_code(proc, 1.0)
        raise LaunchFailed(launched, f"the sandbox runtime did not start ({type(exc).__name__}, exit code {code}); "
                                     f"see {runtime_log(sandbox_dir)}: {log_tail(sandbox_dir)}") from None
    if ready.get("type") != V.READY:
        raise LaunchFailed(launched, f"unexpected first frame from the runtime: {ready.get('type')!r}")
    launched.ready = ready
    return launched


class LaunchFailed(RuntimeError):
    """The process started but its runtime never became ready: the caller still owns it."""

    def __init__(self, launched: Launched, message: str):
        super().__init__(message)
        self.launched = launched


def runtime_log(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "runtime.log")


def log_tail(sandbox_dir: str, n: int = 800) -> str:
    try:
        with open(runtime_log(sandbox_dir), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def exit_code(proc: asyncio.subprocess.Process, wait: float) -> int | None:
    try:
        return await asyncio.wait_for(proc.wait(), wait)
    except asyncio.TimeoutError:
        return None


async def keep_log(stream: asyncio.StreamReader, path: str) -> None:
    """bwrap's and the runtime's own diagnostics, kept up to a cap: the sandbox writes
    them, so they must not become a way around its disk limit."""
    written = 0
    with open_private_log(path) as log:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if written < RUNTIME_LOG_BYTES:
                chunk = chunk[:RUNTIME_LOG_BYTES - written]
                log.write(chunk)
                log.flush()
                written += len(chunk)
                if written >= RUNTIME_LOG_BYTES:
                    log.write(b"\n[runtime log truncated]\n")
