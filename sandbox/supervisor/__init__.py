"""The per-sandbox supervisor: the one process that owns a sandbox's life.

Like containerd-shim or conmon, it runs detached from the server (its own session), is the
parent of the sandbox's isolated process (so bwrap's ``--die-with-parent`` ties the sandbox
to the supervisor, never to the server), holds the runtime's channel and serves it on a unix
socket in the sandbox's 0700 state directory. The server can therefore crash, restart and
re-attach while every sandbox keeps its interpreter state.

The supervisor also enforces what must hold even when no server is running: the TTL and
the absolute lifetime cap (it ends its own sandbox), the per-execute timeout (interrupt,
then kill), and the record of why a sandbox died (OOM, pids, crash), written atomically to
``state.json`` before it exits. Forked from the supervisor template (``template``), which
runs ``__main__``'s main in the child, or started as ``python -m sandbox.supervisor``
(see ``__main__``); one module per job, composed in ``lifecycle.Supervisor``.
"""

import typing as t

if t.TYPE_CHECKING:
    from .lifecycle import Supervisor


def __getattr__(name: str) -> t.Any:
    """`Supervisor`, imported when first asked for: `python -m sandbox.supervisor` runs this
    package first, and its entry point leaves out what a supervisor does not use before
    asyncio is imported (`__main__`)."""
    if name == "Supervisor":
        from .lifecycle import Supervisor

        return Supervisor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Supervisor"]
