"""Running a cell: the kernel's magics, then the code in the sandbox, its events mapped to
IOPub messages; a ``%%host`` cell in the kernel's own process; comm messages from the page.

A server that is briefly away (restarting) is retried for a short while, and started again
if it is the kernel's own; after that the cell fails with a short message. A component of
`SandboxLifecycle` (kernel/lifecycle.py): it owns the running cell (which the control
thread reads to interrupt it), the comm messages in flight, the ``%%host`` namespace and
what it knows of the sandbox's count; it gets its sandbox from the claim (claim.py) and its
counts from the kernel's queue (queue.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pathlib
import time
import typing as t
from dataclasses import dataclass

from sandbox.runtime import vocabulary as V
from sandbox.client import AsyncSandbox, SandboxError, SandboxGone, SandboxNotFound, ServerConfig, ServerUnavailable

from . import output_mode, saved_state, usage_note
from .binding import all_bindings
from .cell_output import Output
from .claim import SandboxClaim
from .config import SandboxSettings
from .failure import CellFailure
from .keeping import life_left
from .host import HostNamespace, host_cells_enabled, is_host_cell
from .magics import run_magic, split_cell
from .notes import show_note
from .channels import input_prompt, reply_payload, reply_user_expressions
from .outputs import CellMapper, died_reason, error_reply, ok_reply, timeout_notice
from .queue import ExecutionCounts
from .report import sandbox_table
from .server import ServerStartError
from .widgets import CommRelay


class _OutWriter:
    """A file-like object that turns writes into the cell's stream output, a line at a time
    (print("a", "b") is four writes; one message each would flood IOPub)."""

    def __init__(self, out: t.Any, name: str) -> None:
        self.out, self.name = out, name
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        cut = self.pending.rfind("\n") + 1
        if cut:
            self.out.stream(self.name, self.pending[:cut])
            self.pending = self.pending[cut:]
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.out.stream(self.name, self.pending)
            self.pending = ""


@dataclass
class _Cell:
    """The running cell, as the control thread needs to see it to interrupt it."""

    task: asyncio.Task
    loop: asyncio.AbstractEventLoop
    remote: bool = False
    waiting: asyncio.Future | None = None  # the frontend's answer to input(), while asked


class _Host:
    """What the magics see during one cell."""

    def __init__(self, cells: CellRunner, out: Output, sandbox: AsyncSandbox) -> None:
        claim = cells.claim
        self.cwd = cells.cwd
        self.airlock_root = cells.airlock_root
        self.pull_max_bytes = cells.settings.pull_max_bytes
        self.outputs_mode = output_mode.describe(cells.settings)
        self.pushed = claim.pushed
        self.server_url = claim.server_config.url if claim.server_config else ""
        self._claim = claim
        self._out = out
        self._sandbox = sandbox

    async def sandbox(self) -> AsyncSandbox:
        # The kernel's current one: `%sandbox new` or `attach` earlier in the cell may have changed it.
        return self._claim.sandbox or self._sandbox

    def stdout(self, text: str) -> None:
        self._out.stream("stdout", text)

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None:
        self._out.display(data, display_id=display_id, update=update)

    async def new_sandbox(self) -> str:
        old, sbx = await self._claim.start_fresh()
        self.pushed = self._claim.pushed
        was = f" (the old one, {old}, was deleted)" if old else ""
        return f"new sandbox {sbx.id}{was}\n"

    async def attach_sandbox(self, sandbox_id: str) -> str:
        old, sbx, moved = await self._claim.attach(sandbox_id)
        self.pushed = self._claim.pushed
        text = f"attached to sandbox {sbx.id} ({life_left(sbx.info)}); its state is this kernel's now"
        if moved:
            text += f" and this notebook's (it was {', '.join(moved)}'s)"
        if old:
            text += f"; {old} is left as it was until its TTL ends it (%sandbox attach {old} takes it back)"
        return text + "\n"

    def cell_timeout(self, seconds: float | None = None) -> float | None:
        if seconds is not None:
            self._claim.settings.execute_timeout = seconds
        return self._claim.settings.execute_timeout

    def config(self) -> ServerConfig:
        return self._claim.config()

    def save_label(self) -> str | None:
        return saved_state.label_of(self._claim.keeper)

    async def list_sandboxes(self) -> str:
        config = self._claim.config()
        infos = await AsyncSandbox.list(config=config)
        lease = self._claim.keeper.lease
        return sandbox_table(infos, all_bindings(config.state_dir), self._claim.sandbox_id,
                             lease.path if lease is not None else None)


class CellRunner:
    """One cell (or one comm message from the page) from the kernel to the sandbox and back."""

    def __init__(self, claim: SandboxClaim, counts: ExecutionCounts, settings: SandboxSettings, log: t.Any,
                 cwd: pathlib.Path, airlock_root: pathlib.Path) -> None:
        self.claim = claim
        self.counts = counts  # the kernel's (kernel/queue.py)
        self.settings = settings
        self.log = log
        self.cwd = cwd  # the notebook's folder
        self.airlock_root = airlock_root  # the only host folder %push reads and %pull writes
        self.host_cells = HostNamespace()
        self.comms = CommRelay(self.passthrough)
        self.comms_in_flight = 0  # comm messages from the page the sandbox is handling
        self.cell: _Cell | None = None  # the running cell, as the control thread reads it
        self.sandbox_next: int | None = None  # the count the sandbox's IPython gives its next cell, if known

    @property
    def passthrough(self) -> bool:
        return output_mode.passthrough(self.settings)

    def adopted(self, sbx: AsyncSandbox) -> None:
        """A sandbox became the kernel's (the claim's `on_adopt`): what it holds is its own."""
        self.sandbox_next = sbx.info.execution_count + 1
        self.comms.models.clear()  # a new sandbox holds none of the old one's widgets

    async def run_cell(self, code: str, silent: bool, store_history: bool, out: Output) -> asyncio.Task:
        """Run one cell to its end; the finished task, whose result is the execute reply.

        The cell runs as a task of its own so that an interrupt arriving while no code runs
        in the sandbox yet (server starting, file uploading) can cancel just it; `cell`,
        which the control thread reads to interrupt, is this object's alone.
        """
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run_cell(code, silent, store_history, out))
        self.cell = _Cell(task, loop)
        try:
            await asyncio.wait({task})
        finally:
            self.cell = None
        return task

    async def _run_cell(self, code: str, silent: bool, store_history: bool, out: Output) -> dict[str, t.Any]:
        """Run the kernel's magics, then the code in the sandbox; the execute reply."""
        if is_host_cell(code):
            return await self._run_host_cell(code, out)
        calls, rest = split_cell(code)
        replaced = False
        deadline: float | None = None
        while True:
            try:
                sbx = await self.claim.ensure(out)
                host = _Host(self, out, sbx)
                for call in calls:
                    await run_magic(call, host)
                sbx = await host.sandbox()  # `%sandbox new` or `attach` may have changed it
                if not rest:
                    # A cell of magics only: its count is the kernel's (kernel/queue.py).
                    return ok_reply(self.counts.next)
                return await self._execute(sbx, rest, silent, store_history, out)
            except (SandboxGone, SandboxNotFound) as exc:
                # Nothing of the cell ran in a gone sandbox: run it whole in a new one.
                if replaced:
                    raise CellFailure("SandboxGone", exc.message) from None
                replaced = True
                self.claim.mark_gone(exc.message)
            except ServerUnavailable as exc:
                if exc.sent and exc.status != 503:
                    # The request may have reached the server: sending it again could
                    # run the cell twice.
                    raise CellFailure("ServerUnavailable", exc.message) from None
                if deadline is None:
                    deadline = time.monotonic() + self.settings.reconnect_timeout
                    show_note(out, "sandbox server unreachable, retrying…")
                await self._wait_for_server(exc, deadline)
            except SandboxError as exc:
                raise CellFailure(type(exc).__name__, exc.message) from None

    async def _run_host_cell(self, code: str, out: Output) -> dict[str, t.Any]:
        """A ``%%host`` cell: run here, in the kernel's process (see kernel/host.py)."""
        if not host_cells_enabled():
            raise CellFailure("HostCellsDisabled", "%%host cells are switched off for this kernel "
                                "(SANDBOX_KERNEL_HOST_CELLS=0); every cell runs in the sandbox")
        count = self.counts.next
        stdout, stderr = _OutWriter(out, "stdout"), _OutWriter(out, "stderr")
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            value, error = await self.host_cells.run(code)
        stdout.flush()
        stderr.flush()
        if error is not None:
            out.send("error", error)
            return error_reply(count, error)
        if value is not None:
            out.send("execute_result", {"execution_count": count, "data": {"text/plain": repr(value)}, "metadata": {}})
        return ok_reply(count)

    async def _wait_for_server(self, exc: ServerUnavailable, deadline: float) -> None:
        if time.monotonic() >= deadline:
            raise CellFailure("ServerUnavailable", exc.message)
        if self.claim.embedded:
            # Our own server went away: start it again (the sandboxes outlive it).
            try:
                await self.claim.start_server_if_ours()
            except ServerStartError as err:
                raise CellFailure("ServerUnavailable", str(err)) from None
        else:
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    async def _execute(
        self, sbx: AsyncSandbox, code: str, silent: bool, store_history: bool, out: Output
    ) -> dict[str, t.Any]:
        if not silent:
            await self._align_count(sbx)
        mapper = CellMapper(execution_count=self.counts.next, passthrough=self.passthrough)
        on_event = self._event_handler(sbx, mapper, out)
        cell = self.cell
        if cell is not None:
            cell.remote = True
        try:
            execution = await sbx.run_code(
                code,
                timeout_seconds=self.settings.execute_timeout,
                silent=silent,
                store_history=store_history,
                on_event=on_event,
                allow_stdin=out.allow_stdin,
                user_expressions=out.user_expressions or None,
                msg_id=out.msg_id,
                stream_limit=self.settings.stream_limit or None,
            )
        finally:
            if cell is not None:
                cell.remote = False
        owed, reply = mapper.finish()
        reply["payload"], notes = reply_payload(execution.payload, code, self.passthrough)
        owed += notes
        if reply["status"] == "ok":
            reply["user_expressions"] = reply_user_expressions(execution.user_expressions, self.passthrough)
        for msg_type, content in owed:
            out.send(msg_type, content)
        for note in (usage_note.after_cell(mapper.done, usage_note.memory_limit(sbx)), timeout_notice(mapper.done)):
            if note and not silent:
                show_note(out, note)
        if execution.execution_count is not None:
            self.sandbox_next = execution.execution_count + 1
        if mapper.sandbox_gone:
            self.claim.mark_gone(died_reason(mapper.done or {}))
        out.text_result = mapper.text_result
        return reply

    async def _align_count(self, sbx: AsyncSandbox) -> None:
        """Set the sandbox's IPython to the kernel's count before a cell runs there, so
        that `Out[n]`, `_n` and its prompts say what the notebook shows: they part after a
        ``%%host`` cell or a cell of magics only (the sandbox ran nothing), a replaced
        sandbox, a notebook's kept sandbox taken back (its count runs on from its last
        kernel), or a cell interrupted before it reached the sandbox. A silent request
        changes nothing in IPython's count and shows nothing."""
        if self.sandbox_next == self.counts.next:
            return
        done = await sbx.run_code(f"get_ipython().execution_count = {int(self.counts.next)}",
                                  silent=True, store_history=False,
                                  timeout_seconds=self.settings.execute_timeout)
        self.sandbox_next = self.counts.next if done.status == "ok" else None

    def _event_handler(self, sbx: AsyncSandbox, mapper: CellMapper, out: Output):
        """The sandbox events of one request -> IOPub messages, comm messages through the
        widget rules, and input() answered through the frontend."""

        async def on_event(event: dict[str, t.Any]) -> None:
            kind = event.get("type")
            if kind == V.INPUT_REQUEST:
                await self._answer_input(sbx, event, out)
            elif kind in V.COMM_MESSAGES:
                relayed = self.comms.to_page(event)
                if relayed.message is not None:
                    out.comm(relayed.message)
                for note in relayed.notes:
                    show_note(out, note)
            else:
                for msg_type, content in mapper.feed(event):
                    out.send(msg_type, content)

        return on_event

    async def _answer_input(self, sbx: AsyncSandbox, event: dict[str, t.Any], out: Output) -> None:
        """Ask the frontend (its stdin channel) and hand the answer to the waiting cell. An
        interrupt cancels the question: the cell itself is interrupted in the sandbox."""
        cell = self.cell
        question = asyncio.ensure_future(out.ask_input(*input_prompt(event)))
        if cell is not None:
            cell.waiting = question
        try:
            await asyncio.wait({question})
        except asyncio.CancelledError:
            question.cancel()
            raise
        finally:
            if cell is not None:
                cell.waiting = None
        if not question.cancelled():
            await sbx.answer_input(question.result())

    async def run_comm(self, msg_type: str, content: dict[str, t.Any], metadata: dict[str, t.Any],
                       buffers: list[bytes], out: Output) -> None:
        """A comm message from the page (a slider moved): its handlers run in the sandbox,
        queued behind a running cell as in ipykernel, and what they output goes to the page
        under this message (an Output widget shows what was made under its id)."""
        sbx = await self.claim.current()
        if sbx is None:
            return  # no sandbox (yet, or any more): nothing holds the other end of the comm
        self.comms.from_page(msg_type, content)
        mapper = CellMapper(passthrough=self.passthrough)
        self.comms_in_flight += 1
        try:
            await sbx.send_comm(
                msg_type, str(content.get("comm_id", "")), content.get("data") or {},
                metadata=metadata or None, buffers=[base64.b64encode(bytes(b)).decode("ascii") for b in buffers] or None,
                target_name=content.get("target_name"), msg_id=out.msg_id,
                timeout_seconds=self.settings.execute_timeout, on_event=self._event_handler(sbx, mapper, out))
        except (SandboxGone, SandboxNotFound) as exc:
            self.claim.mark_gone(exc.message)
        except SandboxError as exc:
            self.log.warning("a comm message did not reach the sandbox: %s", exc)
        finally:
            self.comms_in_flight -= 1
        if mapper.sandbox_gone:
            self.claim.mark_gone(died_reason(mapper.done or {}))
