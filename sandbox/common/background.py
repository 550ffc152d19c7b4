"""Tasks that nobody awaits, held until they end.

asyncio's loop keeps only a weak reference to a task. A task that nothing else holds, and
that waits on a future only it can reach (a socket read, an HTTP response), is one cycle of
garbage: the cycle collector destroys it in the middle of its await ("Task was destroyed but
it is pending!"), its `finally` blocks run at a random point, and its work never finishes.
Seen under load: a widget's comm message, whose shell task the kernel had handed to pyzmq
(which keeps no reference), was collected while it waited for the sandbox; its idle never
went out, and the page's slider stopped sending (ipywidgets waits for that idle).

Every task that nothing else owns is started here (a task an owner cancels or awaits, as
the manager's at shutdown, stays with that owner).
"""

from __future__ import annotations

import asyncio
import contextvars
import typing as t

_HELD: set[asyncio.Task] = set()


def spawn(coro: t.Coroutine[t.Any, t.Any, t.Any], *, context: contextvars.Context | None = None) -> asyncio.Task:
    """``coro`` as a task on the running loop, held until it is done."""
    task = asyncio.get_running_loop().create_task(coro, context=context)
    _HELD.add(task)
    task.add_done_callback(_HELD.discard)
    return task
