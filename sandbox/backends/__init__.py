"""Isolation backends: how a supervisor starts its sandbox's isolated process.

A backend is the one place that knows an isolation tool (bubblewrap today). The
supervisor prepares what every backend shares (the channel socket, the host resources
in ``sandbox/supervisor/launch.py``), asks the backend to spawn the runtime, and from
then on only talks to the runtime over the channel and waits for the process. A second
backend (say gVisor's ``runsc``) is a module beside ``bubblewrap.py`` implementing
``Backend``, and a name in ``BACKENDS``; nothing else changes.
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


def backend_for(spec: dict) -> Backend:
    """The backend a sandbox's spec names (``isolation_backend``; bubblewrap by default)."""
    name = spec.get("isolation_backend") or "bwrap"
    try:
        module = BACKENDS[name]
    except KeyError:
        raise RuntimeError(f"unknown isolation backend {name!r} (known: {', '.join(sorted(BACKENDS))})") from None
    return module()


def _bubblewrap() -> Backend:
    from .bubblewrap import BubblewrapBackend

    return BubblewrapBackend()


def _gvisor() -> Backend:
    from .gvisor import GvisorBackend

    return GvisorBackend()


# name -> a factory; imported lazily so a backend's imports cost only its own sandboxes
BACKENDS: dict[str, Callable[[], Backend]] = {"bwrap": _bubblewrap, "gvisor": _gvisor}
