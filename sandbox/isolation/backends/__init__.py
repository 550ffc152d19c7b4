"""Isolation backends: how a supervisor starts its sandbox's isolated process.

A backend is the one place that knows an isolation tool (bubblewrap today). The
supervisor prepares what every backend shares (the channel socket, the host resources
in ``sandbox/supervisor/launch.py``), asks the backend to spawn the runtime, and from
then on only talks to the runtime over the channel and waits for the process. A second
backend (say gVisor's ``runsc``) is a module beside ``bubblewrap.py`` implementing
``Backend``, and a name in ``BACKENDS``; nothing else changes.
"""

from __future__ import annotations

from typing import Callable

from .base import SOCKET, STDIO, Backend, Launch

__all__ = ["SOCKET", "STDIO", "BACKENDS", "Backend", "Launch", "backend_for"]


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
