"""What a supervisor and an isolation backend share: the launch request, the channel kinds,
and the protocol every backend implements. The backends (``bubblewrap``, ``gvisor``) import
this, never the package that chooses between them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Protocol


@dataclass
class Launch:
    """What the supervisor hands a backend to start one sandbox.

    ``child_setup`` runs in the forked child before the backend's tool is executed (it
    joins the cgroup, sets the rlimits and drops to the sandbox's uid); ``isolation`` is
    the sandbox's isolation report, which the backend completes with what it enforces.
    """

    spec: dict
    channel_fd: int | None  # None for a backend whose channel is its process's stdin and stdout
    child_setup: Callable[[], None]
    isolation: dict = field(default_factory=dict)
    sandbox_dir: str = ""
    restore: bool = False  # bring a paused sandbox back from its checkpoint (gvisor)


#: A backend's ``channel``: the runtime's channel is a socket passed as an fd (``SOCKET``),
#: or the process's stdin and stdout, its diagnostics on stderr (``STDIO``: gVisor, where a
#: host socket inside the container would make a checkpoint fail).
SOCKET, STDIO = "socket", "stdio"


class Backend(Protocol):
    name: str
    channel: str  # SOCKET or STDIO
    as_root: bool  # the tool runs as root (runsc); child_setup then only joins the cgroup

    async def spawn(self, launch: Launch) -> asyncio.subprocess.Process:
        """Start the runtime isolated, its channel on ``launch.channel_fd``; stdout and stderr
        (the tool's and the runtime's diagnostics) on one pipe, stdin from /dev/null."""
        ...
