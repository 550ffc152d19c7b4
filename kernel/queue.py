"""The shell requests in the order they arrived: the execution counts a frontend sees, and
the abort of every execute request queued behind a failing one.

Both follow ipykernel, because notebooks, nbclient and papermill are written against it:

- counts are IPython's (`InteractiveShell.execution_count`): a cell that is not silent shows
  the next count in `execute_input`; a cell stored in history takes it, whatever runs it
  (the sandbox, a ``%%host`` cell, only the kernel's magics) and however it ends; the reply
  says the last count taken. They are the kernel's, not the sandbox's, so they are known
  before a sandbox is claimed and stay one sequence when a sandbox is replaced; the
  sandbox's own IPython is set to the same count before a cell runs there (cells.py).
- after an error in a request with `stop_on_error`, every execute request that arrived
  before the error's reply was sent is answered `aborted`, in order, including those that
  came while the failing cell still ran; what arrives later runs. ipykernel 7 does this by
  posting a "stop aborting" message behind everything its shell thread has forwarded; this
  kernel reads the shell socket on its main loop (app.py: no shell thread), so the same
  marker is queued here behind every message already read, by the same path they took.
"""

from __future__ import annotations

import asyncio
import contextvars
import typing as t

import zmq

from sandbox.common.background import spawn

# ipykernel's own marker (kernelbase.dispatch_shell): a one-frame message that, when its
# turn comes, ends the abort.
STOP_ABORTING = b"stop aborting"


class ExecutionCounts:
    """IPython's execution count, kept by the kernel."""

    def __init__(self, start: int = 1) -> None:
        self.next = start  # the count the next stored cell takes (IPython's execution_count)

    def finish(self, silent: bool, store_history: bool) -> int:
        """The cell ended (ran, failed or was interrupted): the count its reply says."""
        if store_history and not silent:
            self.next += 1
        return self.next - 1


class ShellQueue:
    """Shell messages to the kernel's dispatcher, one task each, in arrival order, and the
    abort behind an error.

    `dispatch(msg)` is the kernel's handler of one raw message (ipykernel's `shell_main`):
    each waits its turn on the kernel's lock, whose waiters are served first come, first
    served; so a message handed over later is handled later. `read_pending` reads what the
    shell socket holds already (each message comes back through `receive`).
    """

    def __init__(self, dispatch: t.Callable[[list[t.Any]], t.Awaitable[None]],
                 read_pending: t.Callable[[], t.Any] = lambda: None) -> None:
        self.dispatch = dispatch
        self.read_pending = read_pending
        self.aborting = False
        self._context = contextvars.copy_context()

    def receive(self, msg: list[t.Any]) -> asyncio.Task:
        """One message from the shell socket: its handling starts now, behind every
        message received before it.

        Each message in a context of its own (a copy of the kernel's), where ipykernel
        shares one among all: its parent header is a context variable, and a comm message
        dispatched beside a running request sets the parent back to that request's when it
        ends. Here a comm message waits for the sandbox (its claim, then its handlers),
        so it often ends after the next cell started: in one shared context the cell's
        idle then went out under the earlier request's msg_id, and JupyterLab kept the
        cell at `[*]` for good (it waits for the idle under the cell's own id).

        Held until it ends (sandbox/common/background.py): pyzmq keeps no reference to the
        task its callback returns, and a message collected while it waited for the sandbox
        never sent its idle: the page's widget stopped sending."""
        return spawn(self.dispatch(msg), context=self._context.copy())

    def abort_queued(self) -> None:
        """An execute request failed with stop_on_error: abort every execute request
        received so far (read the socket first: what a frontend sent before the error
        reply may still be there), and stop aborting when the marker's turn comes."""
        self.aborting = True
        self.read_pending()
        self.receive([zmq.Frame(STOP_ABORTING)])

    def stop_aborting(self) -> None:
        self.aborting = False
