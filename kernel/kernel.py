"""The Jupyter side: maps the kernel protocol onto a sandbox on the server.

Protocol mapping only: execute, interrupt, shutdown, completion, inspection and history
messages become calls on the sandbox (through `SandboxLifecycle`, which also recovers
from a gone sandbox or an absent server); sandbox events become IOPub messages
(`outputs`); the kernel's own magics are in `magics`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import platform
import signal
import typing as t
from fnmatch import fnmatchcase
from functools import partial

import zmq
from ipykernel._version import kernel_protocol_version
from ipykernel.kernelbase import Kernel
from traitlets import Float

from sandbox.common.background import spawn
from sandbox.runtime import vocabulary as V

from . import __version__
from .channels import complete_reply, inspect_reply, is_complete_reply
from .config import SandboxSettings
from .failure import CellFailure
from .lifecycle import SandboxLifecycle
from .magics import magic_name_matches, push_path_completions
from .outputs import error_content, error_reply
from .queue import ExecutionCounts, ShellQueue
from .widgets import CommMessage

# Whether the shell message being handled was dispatched beside a running request
# (ipykernel does that for comm messages, and publishes no status for them then).
_BESIDE_ANOTHER: contextvars.ContextVar[bool] = contextvars.ContextVar("beside_another", default=False)


class _Out:
    """Publishes one cell's output on IOPub, or nothing at all for a silent cell.

    The parent header is captured at the start of the cell, so that output sent from
    worker threads (progress bars during uploads) is still attributed to the cell.
    """

    def __init__(self, kernel: SandboxKernel, silent: bool, allow_stdin: bool = False,
                 user_expressions: dict | None = None) -> None:
        self.kernel = kernel
        self.silent = silent
        self.allow_stdin = allow_stdin
        self.user_expressions = user_expressions
        self.parent = kernel.get_parent("shell")
        self.ident = kernel._parent_ident["shell"]
        self.msg_id: str | None = (self.parent.get("header") or {}).get("msg_id")
        self.error: dict[str, t.Any] | None = None
        self.text_result: str | None = None

    def send(self, msg_type: str, content: dict[str, t.Any], buffers: list[bytes] | None = None) -> None:
        if msg_type == "error":
            self.error = content
        if self.silent or self.kernel.session is None:
            return
        self.kernel.session.send(
            self.kernel.iopub_socket, msg_type, content, parent=self.parent, ident=self.kernel._topic(msg_type),
            buffers=buffers,
        )

    def comm(self, message: CommMessage) -> None:
        # Sent even for a silent request: a widget is state, not output.
        if self.kernel.session is not None:
            self.kernel.session.send(self.kernel.iopub_socket, message.msg_type, message.content, parent=self.parent,
                                     ident=self.kernel._topic(message.msg_type), buffers=message.buffers or None,
                                     metadata=message.metadata)

    async def ask_input(self, prompt: str, password: bool) -> str:
        """ipykernel's `_input_request`, without blocking the event loop (the execute's
        stream and an interrupt must go on): the question on the stdin channel, then its
        answer, polled."""
        kernel = self.kernel
        socket = kernel.stdin_socket
        while True:  # stale answers of an earlier question
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
        kernel.session.send(socket, "input_request", {"prompt": prompt, "password": password}, self.parent,
                            ident=self.ident)
        while True:
            if socket.poll(0):
                _ident, reply = kernel.session.recv(socket, zmq.NOBLOCK)
                if reply is not None:
                    value = (reply.get("content") or {}).get("value", "")
                    return value if isinstance(value, str) else ""
            await asyncio.sleep(0.02)

    def stream(self, name: str, text: str) -> None:
        self.send("stream", {"name": name, "text": text})

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None:
        self.send(
            "update_display_data" if update else "display_data",
            {"data": data, "metadata": {}, "transient": {"display_id": display_id}},
        )


class SandboxKernel(SandboxSettings, Kernel):
    implementation = "sandbox"
    implementation_version = __version__
    language = "python"
    language_version = platform.python_version()
    language_info = {
        "name": "python",
        "version": platform.python_version(),
        "mimetype": "text/x-python",
        "codemirror_mode": {"name": "ipython", "version": 3},
        "pygments_lexer": "ipython3",
        "nbconvert_exporter": "python",
        "file_extension": ".py",
    }
    banner = (
        f"Python (sandbox) {__version__}: your code runs in an isolated, stateful sandbox "
        "with no network.\n%push / %pull move files in and out of /workspace; %sandbox and "
        "%ttl show where it runs and for how long."
    )
    help_links = [
        {"text": "Python Reference", "url": "https://docs.python.org/3/"},
        {"text": "IPython Reference", "url": "https://ipython.readthedocs.io/en/stable/"},
    ]

    # ipykernel sleeps this long before every execute_reply, as a guard for output still in
    # OutStream buffers. This kernel has none (see `app`): its cell output is published
    # before the reply, on the same IOPub queue, so the sleep would be pure latency.
    _execute_sleep = Float(0.0).tag(config=True)

    def __init__(self, **kwargs: t.Any) -> None:
        super().__init__(**kwargs)
        self.counts = ExecutionCounts()
        self.requests = ShellQueue(partial(self.shell_main, None), self._read_pending_shell)
        self.lifecycle = SandboxLifecycle(self, self.log, counts=self.counts)
        for msg_type in V.COMM_MESSAGES:  # ipykernel hands these to its comm manager; we, to the sandbox
            self.shell_handlers[msg_type] = self.comm_from_page
        self._history: list[tuple[int, int, str, str | None]] = []
        self._history_session = 1
        self._history_line = itertools.count(1)

    @property
    def kernel_info(self) -> dict[str, t.Any]:
        """ipykernel's reply without its question to the debugger.

        ipykernel's own imports ipykernel.debugger, and with it debugpy's pydevd, only to list
        "debugger" among the features: the import prints four "Debugger warning: ... frozen
        modules" lines into the terminal of whoever runs JupyterLab, and the feature would
        offer a debugger this kernel does not have (its cells run in the sandbox; the
        kernelspec says debugger: false). No subshells either (see app.py).
        """
        return {"protocol_version": kernel_protocol_version, "implementation": self.implementation,
                "implementation_version": self.implementation_version, "language_info": self.language_info,
                "banner": self.banner, "help_links": self.help_links, "supported_features": []}

    @property  # type: ignore[override]
    def execution_count(self) -> int:
        """The count the next stored cell takes (kernel/queue.py's `ExecutionCounts`).

        Kernel.execute_request increments and publishes this before the cell runs; the
        count moves when the cell ends, so the setter ignores the increment, as
        IPythonKernel does with its shell's count.
        """
        return self.counts.next

    @execution_count.setter
    def execution_count(self, value: int) -> None:
        pass

    # ------------------------------------------------------------------ the shell queue

    @property  # type: ignore[override]
    def _aborting(self) -> bool:
        """ipykernel's dispatch_shell answers execute requests "aborted" while this holds;
        the queue (kernel/queue.py) owns it."""
        return self.requests.aborting

    @_aborting.setter
    def _aborting(self, value: bool) -> None:
        if value:
            self.requests.aborting = True
        else:
            self.requests.stop_aborting()

    def _abort_queues(self, subshell_id: str | None = None) -> None:
        """After an error with stop_on_error: abort what is queued, as ipykernel 7 does
        with its shell thread (see kernel/queue.py)."""
        self.log.info("Aborting queue")
        self.requests.abort_queued()

    def _read_pending_shell(self) -> None:
        if self.shell_stream is not None:
            self.shell_stream.flush(zmq.POLLIN)

    async def dispatch_shell(self, msg: t.Any, /, subshell_id: str | None = None, *, concurrent: bool = False) -> None:
        """Notes whether the message runs beside another (see comm_from_page).

        Set and never reset: every shell message runs in a context of its own (the queue's
        copy, or ipykernel's copy for a comm message beside a request), so the value ends
        with the message; a reset would raise when a pending message is closed at exit, in
        a context that is not its own."""
        _BESIDE_ANOTHER.set(concurrent)
        await super().dispatch_shell(msg, subshell_id, concurrent=concurrent)

    def start(self) -> None:
        super().start()
        if self.shell_stream is not None:
            # Every shell message through the queue, so that the abort's marker can be
            # queued behind them by the same path (kernel/queue.py).
            self.shell_stream.on_recv(self.requests.receive, copy=False)
        # Claim the sandbox while the user is still typing the first cell; kernel start
        # itself stays fast for jupyter_client's timeouts.
        self.lifecycle.start(self.io_loop.asyncio_loop)
        try:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: no handler, the TTL cleans up
            pass

    def _on_sigterm(self, signum: int, frame: t.Any) -> None:
        """jupyter_client falls back to SIGTERM when shutdown_request goes unanswered: still
        delete the sandbox rather than leave it running until its TTL, unless it is the
        notebook's, kept for its next kernel (see keeping.py)."""
        self.lifecycle.on_terminate()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # ------------------------------------------------------------------ execute

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict | None = None,
        cell_id: str | None = None,
    ) -> dict[str, t.Any]:
        out = _Out(self, silent, allow_stdin=allow_stdin and self.stdin_socket is not None, user_expressions=user_expressions)
        count = self.counts.next
        task = await self.lifecycle.run_cell(code, silent, store_history, out)
        if task.cancelled():
            reply = self._fail(out, count, "KeyboardInterrupt", "")
        elif isinstance(task.exception(), CellFailure):
            failure = t.cast(CellFailure, task.exception())
            reply = self._fail(out, count, failure.ename, failure.evalue)
        elif task.exception() is not None:
            exc = task.exception()
            self.log.error("internal error running a cell", exc_info=exc)
            reply = self._fail(out, count, "KernelError", f"the sandbox kernel failed: {type(exc).__name__}: {exc}")
        else:
            reply = task.result()
        # The count every cell takes, however it ended (IPython's rule; kernel/queue.py).
        reply["execution_count"] = self.counts.finish(silent, store_history)
        if store_history and not silent:
            text = out.text_result if reply.get("status") == "ok" else None
            self._history.append((self._history_session, next(self._history_line), code, text))
        return reply

    def _fail(self, out: _Out, count: int, ename: str, evalue: str) -> dict[str, t.Any]:
        if out.error is None:
            out.send("error", error_content(ename, evalue))
        else:
            # The cell already showed its error; this one is context, not a second error.
            out.stream("stderr", f"{ename}: {evalue}\n")
        return error_reply(count, t.cast(dict, out.error))

    async def comm_from_page(self, stream: t.Any, ident: t.Any, parent: dict[str, t.Any]) -> None:
        """comm_open / comm_msg / comm_close from the page (a widget's state changed there):
        delivered to the sandbox, where the widget's handlers run."""
        content = parent.get("content") if isinstance(parent.get("content"), dict) else {}
        metadata = parent.get("metadata") if isinstance(parent.get("metadata"), dict) else {}
        buffers = [bytes(b) for b in parent.get("buffers") or []]
        out = _Out(self, silent=False)
        try:
            await self.lifecycle.run_comm(parent["header"]["msg_type"], content, metadata, buffers, out)
        except Exception as exc:  # a frontend's message must never take the kernel down
            self.log.warning("comm message not delivered: %s", exc)
        # ipykernel sends no status for a comm message it dispatches beside another request
        # (a cell, or the previous comm message still being handled); but ipywidgets sends a
        # model's next update only once the previous one's idle came: say it then. Handled
        # alone, the message has its busy and idle from ipykernel, as there.
        if _BESIDE_ANOTHER.get():
            self._publish_status("idle", "shell", parent=parent)

    # ------------------------------------------------------------------ control

    def dispatch_control(self, msg: t.Any) -> asyncio.Task:  # type: ignore[override]
        """ipykernel's, as a task held until it ends (sandbox/common/background.py): pyzmq
        keeps no reference to what its callback returns, and a control message waits on the
        sandbox server here (an interrupt, a shutdown that deletes the sandbox); collected in
        that wait, it would never be answered."""
        return spawn(super().dispatch_control(msg))

    async def interrupt_request(self, stream: t.Any, ident: t.Any, parent: t.Any) -> None:
        """Interrupt by message (kernel.json says `interrupt_mode: message`).

        A signal would reach this process, not the sandbox; and ipykernel 7's default
        handling lets KeyboardInterrupt escape an async do_execute. Runs on the control
        thread.
        """
        try:
            await self.lifecycle.interrupt()
        except Exception as exc:  # the reply must go out whatever happened
            self.log.warning("interrupt failed: %s", exc)
        self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    async def do_shutdown(self, restart: bool) -> dict[str, t.Any]:
        """Shut down keeps a notebook's sandbox for its next kernel; Restart (a new kernel
        process, a fresh interpreter as in every kernel) and any other kernel delete it."""
        await self.lifecycle.shutdown(restart)
        return {"status": "ok", "restart": restart}

    # ------------------------------------------------------------------ introspection

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, t.Any]:
        pos = len(code) if cursor_pos is None else cursor_pos
        local = push_path_completions(code, pos, self.lifecycle.airlock_root)
        if local is not None:
            return local
        answer = await self.lifecycle.ask(lambda s: s.complete(code, pos))
        reply = complete_reply(answer, code, pos, self.lifecycle.outputs_passthrough)
        ours = magic_name_matches(code, pos)
        if ours:
            start = code.rfind("\n", 0, pos) + 1
            if not reply.get("matches"):
                reply.update(matches=[], cursor_start=start, cursor_end=pos)
            if reply.get("cursor_start") == start:
                reply["matches"] = ours + [m for m in reply["matches"] if m not in ours]
        return reply

    async def do_inspect(
        self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: t.Any = ()
    ) -> dict[str, t.Any]:
        reply = await self.lifecycle.ask(lambda s: s.inspect(code, cursor_pos, detail_level))
        return inspect_reply(reply, self.lifecycle.outputs_passthrough)

    async def do_is_complete(self, code: str) -> dict[str, t.Any]:
        reply = is_complete_reply(await self.lifecycle.ask(lambda s: s.is_complete(code)))
        return reply if reply is not None else local_is_complete(code)

    async def do_history(
        self,
        hist_access_type: str,
        output: bool,
        raw: bool,
        session: int | None = None,
        start: int | None = None,
        stop: int | None = None,
        n: int | None = None,
        pattern: str | None = None,
        unique: bool = False,
    ) -> dict[str, t.Any]:
        """This kernel's own record of its cells (the sandbox may be replaced; the history
        of the notebook session should not be)."""
        return {
            "status": "ok",
            "history": history_query(self._history, hist_access_type, output, session, start, stop, n, pattern, unique),
        }


def local_is_complete(code: str) -> dict[str, t.Any]:
    """IPython's own check, for when the sandbox cannot be asked."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        status, indent = TransformerManager().check_complete(code)
    except Exception:
        return {"status": "unknown"}
    result: dict[str, t.Any] = {"status": status}
    if status == "incomplete":
        result["indent"] = " " * (indent or 0)
    return result


def history_query(
    entries: list[tuple[int, int, str, str | None]],
    access: str,
    output: bool,
    session: int | None,
    start: int | None,
    stop: int | None,
    n: int | None,
    pattern: str | None,
    unique: bool,
) -> list[tuple[t.Any, ...]]:
    """Jupyter history semantics (tail, range, search with a glob) over our own list."""
    if access == "tail":
        chosen = entries[-n:] if n else list(entries)
    elif access == "range":
        chosen = [
            e
            for e in entries
            if (session in (None, 0) or session < 0 or e[0] == session)
            and (start is None or e[1] >= start)
            and (stop is None or e[1] < stop)
        ]
    elif access == "search":
        chosen = [e for e in entries if fnmatchcase(e[2], pattern or "*")]
        if unique:
            seen: set[str] = set()
            kept = []
            for e in reversed(chosen):
                if e[2] not in seen:
                    seen.add(e[2])
                    kept.append(e)
            chosen = kept[::-1]
        if n:
            chosen = chosen[-n:]
    else:
        chosen = []
    if output:
        return [(s, line, (code, text)) for s, line, code, text in chosen]
    return [(s, line, code) for s, line, code, _ in chosen]
