"""A kernel ends when the Jupyter server that started it is gone, also when it was forked.

ipykernel watches for that by its parent pid: `JPY_PARENT_PID` names the server, and a
change of `getppid()` means the server died. A kernel forked by the fork server
(kernel/forkserver.py) has the fork server as its parent, not the Jupyter server; ipykernel
would then only notice the fork server's death. This watch waits on the named process
itself, by a pidfd (no pid reuse can fool it), and ends the kernel as ipykernel's would.
"""

from __future__ import annotations

import os
import select
import threading

from traitlets.log import get_logger


class ParentWatch(threading.Thread):
    """Exit the process (status 1, as ipykernel's poller does) when process `pid` ends."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="parent-watch", daemon=True)
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone before this kernel got this far
            self.pidfd = None

    def run(self) -> None:
        if self.pidfd is not None:
            select.select([self.pidfd], [], [])
        get_logger().warning("Parent appears to have exited, shutting down.")
        os._exit(1)


def watch_for(parent_handle: int) -> ParentWatch | None:
    """A watch on `parent_handle` if this process's parent is another (forked by the fork
    server), and the platform can watch it; None: ipykernel's own poller does the job."""
    if not parent_handle or parent_handle == 1 or os.getppid() == parent_handle or not hasattr(os, "pidfd_open"):
        return None
    try:
        return ParentWatch(parent_handle)
    except OSError:  # gone already, or not ours to see
        return None
