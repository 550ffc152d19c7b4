"""The kernel's shell queue on its own (kernel/queue.py): execution counts by IPython's
rule, checked against a real IPython shell, and the abort of every execute request queued
behind an error, on a real asyncio loop with a dispatcher that waits its turn on a lock as
ipykernel's `shell_main` does."""

from __future__ import annotations

import asyncio
import typing as t

import zmq

from collection import lives_through_a_collection, waiting_handler
from kernel.queue import STOP_ABORTING, ExecutionCounts, ShellQueue


# ------------------------------------------------------------------ counts


CELLS = [  # (code, silent, store_history) as frontends send them
    ("a = 1", False, True),
    ("a", True, False),  # silent
    ("a + 1", False, False),  # not stored (a frontend's probe)
    ("1 / 0", False, True),  # an error takes its count too
    ("%nosuchmagic", False, True),  # so does a UsageError
    ("a + 2", False, True),
]


def test_counts_follow_ipython():
    """The count each reply says, from a real IPython shell and from ExecutionCounts."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell()
    counts = ExecutionCounts()
    for code, silent, store in CELLS:
        assert counts.next == shell.execution_count  # what execute_input shows
        shell.run_cell(code, store_history=store, silent=silent)
        assert counts.finish(silent, store) == shell.execution_count - 1, code


# ------------------------------------------------------------------ the abort


class Dispatcher:
    """ipykernel's handling of one shell message, reduced to its order: each message waits
    for the lock (first come, first served), an execute request while aborting is
    answered "aborted", the marker ends the abort, and "fail" fails with stop_on_error."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.answers: list[tuple[str, str]] = []
        self.queue: ShellQueue | None = None
        self.release = asyncio.Event()
        self.socket: list[str] = []  # messages sent but not yet read off the socket

    async def __call__(self, msg: list[t.Any]) -> None:
        assert self.queue is not None
        async with self.lock:
            if len(msg) == 1 and isinstance(msg[0], zmq.Frame) and msg[0].bytes == STOP_ABORTING:
                self.queue.stop_aborting()
                return
            (name,) = msg
            if self.queue.aborting and not name.startswith("complete"):
                self.answers.append((name, "aborted"))
                return
            if name.startswith("slow"):
                await self.release.wait()
            self.answers.append((name, "error" if "fail" in name else "ok"))
            if "fail" in name:
                self.queue.abort_queued()

    def read_pending(self) -> None:
        assert self.queue is not None
        while self.socket:
            self.queue.receive([self.socket.pop(0)])


def run(scenario: t.Callable[[ShellQueue, Dispatcher], t.Awaitable[None]], legacy: bool = False) -> list[tuple[str, str]]:
    async def main() -> list[tuple[str, str]]:
        dispatcher = Dispatcher()
        queue = ShellQueue(dispatcher, dispatcher.read_pending)
        if legacy:
            # ipykernel's abort without its shell thread: stop aborting on the loop's next
            # turn, whatever is still queued (the control: the bug the queue fixes).
            def abort_queued() -> None:
                queue.aborting = True
                queue.read_pending()
                asyncio.get_running_loop().call_soon(queue.stop_aborting)
            queue.abort_queued = abort_queued  # type: ignore[method-assign]
        dispatcher.queue = queue
        await scenario(queue, dispatcher)
        for _ in range(50):
            await asyncio.sleep(0)
        return dispatcher.answers

    return asyncio.run(main())


async def run_all(queue: ShellQueue, dispatcher: Dispatcher) -> None:
    """Run All: every cell sent at once, the second fails."""
    for name in ("a", "fail", "c", "complete", "d", "e"):
        queue.receive([name])
    await asyncio.sleep(0.01)
    queue.receive(["after"])  # sent once the error was answered: runs


RUN_ALL = [("a", "ok"), ("fail", "error"), ("c", "aborted"), ("complete", "ok"), ("d", "aborted"),
           ("e", "aborted"), ("after", "ok")]


def test_every_queued_request_behind_an_error_is_aborted():
    assert run(run_all) == RUN_ALL


async def arriving_while_it_runs(queue: ShellQueue, dispatcher: Dispatcher) -> None:
    queue.receive(["slow fail"])
    await asyncio.sleep(0.01)
    queue.receive(["b"])  # while the failing cell still runs
    dispatcher.socket.append("c")  # on the socket, not yet read, when the error comes
    dispatcher.release.set()
    await asyncio.sleep(0.01)
    queue.receive(["after"])


def test_requests_arriving_while_the_failing_cell_runs_are_aborted():
    assert run(arriving_while_it_runs) == [("slow fail", "error"), ("b", "aborted"), ("c", "aborted"), ("after", "ok")]


def test_control_an_abort_that_ends_on_the_next_turn_lets_queued_requests_run():
    """The control: ipykernel's abort without its shell thread ends the abort on the loop's
    next turn, before the requests waiting behind the error had theirs."""
    answers = run(arriving_while_it_runs, legacy=True)
    assert ("b", "ok") in answers and ("c", "ok") in answers, answers


# ------------------------------------------------------------------ held until done


def test_a_message_waiting_on_the_sandbox_is_not_collected():
    """A message's task waits on a future only it can reach (the sandbox's HTTP answer):
    nothing but the queue holds it (pyzmq drops what its callback returns), and the cycle
    collector must not end it mid-wait. Under load it did, for a widget's comm message:
    its idle never went out and the page's slider stopped sending."""
    finished: list[bool] = []
    queue = ShellQueue(waiting_handler(finished))
    assert lives_through_a_collection(lambda: queue.receive([zmq.Frame(b"comm_msg")])), \
        "the waiting message's task was collected"
    assert finished == [True], "the message never finished"
