"""The threads that do file work (list, delete, read) for the API, and each sandbox's share.

File work is blocking I/O on a tree the sandbox controls: a sandbox that keeps refilling a
directory makes a ``DELETE /files`` run for up to its deadline, and a few concurrent ones
used to hold every thread of the event loop's default pool, which the server also needs for
its own work, so another sandbox's listing waited seconds. Here file work runs in a pool
of its own (``file_work_threads``), and at most ``file_work_per_sandbox`` calls of one
sandbox run at once; its further calls wait, without a thread, for one of its own to end.
So one sandbox can slow only itself, and the server's pool stays free. The share is one
call by default: a delete is Python work between its syscalls, and each busy file thread
takes the interpreter lock from the event loop that serves every other request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import typing as t

T = t.TypeVar("T")


class FileWork:
    def __init__(self, threads: int, per_sandbox: int) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, threads), thread_name_prefix="file-work")
        self.per_sandbox = max(1, per_sandbox)
        self._shares: dict[str, asyncio.Semaphore] = {}
        self._waiting: dict[str, int] = {}

    async def run(self, sandbox_id: str, fn: t.Callable[..., T], *args: t.Any, **kwargs: t.Any) -> T:
        """``fn(*args, **kwargs)`` in the file-work pool, within the sandbox's share."""
        share = self._shares.get(sandbox_id)
        if share is None:
            share = self._shares[sandbox_id] = asyncio.Semaphore(self.per_sandbox)
        self._waiting[sandbox_id] = self._waiting.get(sandbox_id, 0) + 1
        try:
            async with share:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))
        finally:
            self._waiting[sandbox_id] -= 1
            if not self._waiting[sandbox_id]:  # nobody holds or waits: the share is forgotten
                del self._waiting[sandbox_id]
                self._shares.pop(sandbox_id, None)

    def in_use(self, sandbox_id: str) -> int:
        """Calls of the sandbox running or waiting (for tests and the soak benchmark)."""
        return self._waiting.get(sandbox_id, 0)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
