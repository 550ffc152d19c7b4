"""Whether a process runs: one answer for every caller that holds a pid from a file or a name.

A pid read back from a state file (the kernel's ``server-start.pid``, a server's
``server.json``) or from a directory's name (a gateway's private directory) may belong to a
process that has exited. Such a process can linger as a zombie (exited, not yet reaped by
its parent, which may be the caller itself): ``kill(pid, 0)`` still succeeds on it, so
existence alone would take a dead server, or a dead gateway, for a live one.
"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a process that exists and has not exited (not a zombie, not
    dead). Another user's process counts as alive (``kill`` is refused, yet it runs); when its
    ``/proc`` entry cannot be read, existence is all that is known."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True
