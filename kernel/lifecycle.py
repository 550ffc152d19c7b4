"""The kernel's sandbox over its life: created at start, used by each cell, replaced when
it is gone, deleted at shutdown.

The kernel holds nothing worth keeping; the sandbox does. What this module adds is
recovery, so that the user never faces a traceback from our code:

- the sandbox is claimed in the background while the user types the first cell, and a
  slow start (the first start of the server builds the image) shows progress in the cell;
- a sandbox that expired, died or was deleted is replaced at the next cell, which first
  says plainly what happened and what was lost (variables, pushed files);
- a server that is briefly away (restarting) is retried for a short while, and started
  again if it is the kernel's own; after that the cell fails with a short message.

Threads: cells run on the main thread's event loop; interrupt and shutdown arrive on
ipykernel's control thread, with its own loop. An httpx client belongs to one loop, so
the control-thread methods attach short-lived clients of their own and read only plain
attributes (`sandbox_id`, `server_config`) of this object.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import pathlib
import time
import typing as t
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from sandbox.runtime import vocabulary as V
from sandbox.client import (
    AsyncSandbox,
    InvalidRequest,
    SandboxError,
    SandboxGone,
    SandboxNotFound,
    ServerConfig,
    ServerUnavailable,
    Unauthorized,
    resolve,
)

from .config import SandboxSettings
from .failure import CellFailure
from .magics import run_magic, split_cell
from .host import HostNamespace, host_cells_enabled, is_host_cell
from .outputs import (CellMapper, died_reason, error_reply, gone_notice, ok_reply, reply_payload,
                      reply_user_expressions)
from .server import ServerStartError, ensure_server
from .widgets import CommMessage, CommRelay

# Show startup progress in the cell only if the wait is long enough to wonder about.
PROGRESS_AFTER = 3.0
CONTROL_TIMEOUT = httpx.Timeout(10.0, connect=3.0)


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


class Output(t.Protocol):
    """Where one cell's output goes (the kernel publishes it on IOPub)."""

    silent: bool
    text_result: str | None
    allow_stdin: bool  # the request's: whether input() may ask the frontend
    user_expressions: dict[str, str] | None
    msg_id: str | None  # the frontend's id of the request (ipywidgets' Output captures by it)

    def send(self, msg_type: str, content: dict[str, t.Any]) -> None: ...

    def comm(self, message: CommMessage) -> None: ...

    async def ask_input(self, prompt: str, password: bool) -> str: ...

    def stream(self, name: str, text: str) -> None: ...

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None: ...


@dataclass
class _Cell:
    """The running cell, as the control thread needs to see it to interrupt it."""

    task: asyncio.Task
    loop: asyncio.AbstractEventLoop
    remote: bool = False
    waiting: asyncio.Future | None = None  # the frontend's answer to input(), while asked


@dataclass
class _Gone:
    sandbox_id: str
    why: str
    pushed: list[str] = field(default_factory=list)


class _Host:
    """What the magics see during one cell."""

    def __init__(self, life: SandboxLifecycle, out: Output, sandbox: AsyncSandbox) -> None:
        self.cwd = life.cwd
        self.airlock_root = life.airlock_root
        self.outputs_mode = life.outputs_mode
        self.pushed = life.pushed
        self.server_url = life.server_config.url if life.server_config else ""
        self._out = out
        self._sandbox = sandbox

    async def sandbox(self) -> AsyncSandbox:
        return self._sandbox

    def stdout(self, text: str) -> None:
        self._out.stream("stdout", text)

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None:
        self._out.display(data, display_id=display_id, update=update)


class SandboxLifecycle:
    def __init__(self, settings: SandboxSettings, log: t.Any, cwd: pathlib.Path | None = None) -> None:
        self.settings = settings
        self.log = log
        self.cwd = cwd or pathlib.Path.cwd()
        self.airlock_root = pathlib.Path(os.path.expanduser(settings.airlock_root)) if settings.airlock_root else self.cwd
        self.server_config: ServerConfig | None = None
        self.sandbox_id: str | None = None
        self.pushed: list[str] = []
        self.host_cells = HostNamespace()
        self.last_count = 0
        self._cell: _Cell | None = None
        self.shutting_down = False
        self._sandbox: AsyncSandbox | None = None
        self._creating: asyncio.Task | None = None
        self._creations_in_flight = 0
        self._status = ""
        self._gone: _Gone | None = None
        self._pending_notice: str | None = None
        self.comms = CommRelay(self.outputs_passthrough)
        self.comms_in_flight = 0  # comm messages from the page the sandbox is handling

    def config(self) -> ServerConfig:
        """Where the server is (sandbox/endpoint.py's rule: the configured URL, else the
        state directory's socket) and the token if one is needed. Resolved once."""
        if self.server_config is None:
            s = self.settings
            self.server_config = resolve(s.url, s.token, s.state_dir)
        return self.server_config

    @property
    def outputs_passthrough(self) -> bool:
        """Whether outputs skip the output policy: only if the user asked for it and host
        cells are on (off means cells may be written by something other than the user)."""
        return bool(self.settings.unsafe_trust_sandbox_outputs) and host_cells_enabled()

    @property
    def outputs_mode(self) -> str:
        """What `%sandbox` says about outputs."""
        if self.outputs_passthrough:
            return "UNFILTERED: HTML and JavaScript run in this page with your rights (unsafe_trust_sandbox_outputs)"
        mode = "isolated: HTML/JS/SVG/Markdown in sandboxed frames, images checked, metadata filtered"
        if self.settings.unsafe_trust_sandbox_outputs:
            mode += " (pass-through ignored: host cells are off)"
        return mode

    @property
    def embedded(self) -> bool:
        """Whether the kernel looks after the local server itself: by default only when
        no URL is configured (the state directory's own server); `start_server=True` also
        for a configured unix socket or loopback URL."""
        start = self.settings.start_server
        if start is None:
            return not self.settings.url
        config = self.config()
        host = urlsplit(config.url).hostname or ""
        return bool(start) and (bool(config.socket) or host in ("localhost", "::1") or host.startswith("127."))

    # ------------------------------------------------------------------ creating

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Claim the sandbox in the background; the first cell awaits it."""
        self._creating = loop.create_task(self._create())
        self._creating.add_done_callback(self._log_creation_failure)

    def _log_creation_failure(self, task: asyncio.Task) -> None:
        # Retrieved here so that asyncio does not print "exception never retrieved"
        # into whichever cell runs next; the first cell reports it properly.
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("creating the sandbox at start failed: %s", task.exception())

    def _set_status(self, text: str) -> None:
        self._status = text

    async def _start_server_if_ours(self) -> None:
        if not self.embedded:
            return
        config = self.config()
        started = await asyncio.to_thread(
            ensure_server,
            config.endpoint,
            config.state_dir,
            timeout=self.settings.server_start_timeout,
            on_status=self._set_status,
        )
        if started:
            self.log.info("started the sandbox server at %s", config.where)

    async def _create(self) -> AsyncSandbox:
        self._creations_in_flight += 1
        try:
            config = self.config()
            await self._start_server_if_ours()
            self._set_status("creating the sandbox")
            sbx = await AsyncSandbox.create(
                **self.settings.create_arguments(),
                metadata={"client": "sandbox-kernel", "kernel_pid": os.getpid()},
                config=config,
                # Over the socket the server ends the sandbox when this process exits,
                # even if it is killed without a shutdown (nbval, kill -9).
                end_with_caller=True if config.socket else None,
            )
            # Known to shutdown at once, even before a cell adopts it.
            self.sandbox_id = sbx.id
        finally:
            self._creations_in_flight -= 1
        if self.shutting_down:
            # The shutdown went ahead without this sandbox: do not leave it behind.
            await sbx.delete()
            await sbx.close()
            raise CellFailure("KernelShutdown", "the kernel is shutting down")
        self.log.info("sandbox %s (%s)", sbx.id, "warm pool" if sbx.info.from_pool else "cold start")
        return sbx

    def _adopt(self, sbx: AsyncSandbox) -> None:
        self._sandbox = sbx
        self.sandbox_id = sbx.id
        self.last_count = sbx.info.execution_count
        self.comms.models.clear()  # a new sandbox holds none of the old one's widgets
        gone, self._gone = self._gone, None
        if gone is not None:
            self._pending_notice = gone_notice(gone.sandbox_id, gone.why, gone.pushed, sbx.id)

    async def _await_creation(self, task: asyncio.Task, out: Output) -> AsyncSandbox:
        """Wait for a sandbox being created, showing in the cell what takes long (the
        first start of the server builds the image: minutes)."""
        began = time.monotonic()
        display_id = f"sandbox-startup-{uuid.uuid4().hex}"
        shown = False
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            elapsed = time.monotonic() - began
            if not task.done() and elapsed >= PROGRESS_AFTER:
                text = f"{self._status or 'creating the sandbox'} … {elapsed:.0f} s"
                out.display({"text/plain": text}, display_id=display_id, update=shown)
                shown = True
        if shown:
            # Progress is not output: leave no trace in the saved notebook (nbval would
            # see an extra output). Nothing else has been shown in the cell yet but a
            # "retrying" notice that the wait has made obsolete.
            out.send("clear_output", {"wait": False})
        return task.result()

    async def ensure(self, out: Output) -> AsyncSandbox:
        """The sandbox for this cell: the current one, the one being created (at start, or
        for a cell that was interrupted while waiting), or a new one.

        A creation is a task of its own, not part of the cell: interrupting a cell that
        waits for the server leaves the creation going, for the next cell to pick up.
        """
        if self._sandbox is None or self._gone is not None:
            if self._creating is None:
                self._creating = asyncio.get_running_loop().create_task(self._create())
            task = self._creating
            try:
                sbx = await self._await_creation(task, out)
            except ServerStartError as exc:
                raise CellFailure("ServerUnavailable", str(exc)) from None
            except Unauthorized as exc:
                raise CellFailure("Unauthorized", exc.message) from None
            except InvalidRequest as exc:
                raise CellFailure(
                    "InvalidRequest", f"the sandbox server refused to create a sandbox: {exc.message}"
                ) from None
            finally:
                if task.done() and self._creating is task:
                    self._creating = None
            self._adopt(sbx)
        if self._pending_notice and not out.silent:
            # Told in the first cell that shows output, once.
            out.stream("stderr", self._pending_notice)
            self._pending_notice = None
        return t.cast(AsyncSandbox, self._sandbox)

    async def current(self) -> AsyncSandbox | None:
        """The sandbox if there is one to ask, without starting a creation: completion
        should never be what starts a sandbox. A creation under way is awaited."""
        if self._creating is not None:
            task = self._creating
            try:
                sbx = await asyncio.wait_for(asyncio.shield(task), timeout=30.0)
            except (asyncio.TimeoutError, SandboxError, CellFailure, ServerStartError, OSError):
                return None
            finally:
                if task.done() and self._creating is task:
                    self._creating = None
            if self._sandbox is not sbx:
                self._adopt(sbx)
        if self._gone is not None:
            return None
        return self._sandbox

    async def ask(self, call: t.Callable[[AsyncSandbox], t.Awaitable[dict[str, t.Any]]]) -> dict[str, t.Any] | None:
        """A quick question to the sandbox (completion, inspection); None if it cannot answer."""
        sbx = await self.current()
        if sbx is None:
            return None
        try:
            return await call(sbx)
        except (SandboxGone, SandboxNotFound) as exc:
            self.mark_gone(exc.message)
        except SandboxError as exc:
            self.log.warning("sandbox request failed: %s", exc)
        return None

    def mark_gone(self, why: str) -> None:
        """Forget the sandbox; the next cell gets a new one and hears why."""
        old = self._sandbox
        if old is None:
            return
        self._gone = _Gone(old.id, why, list(self.pushed))
        self.pushed = []
        self._sandbox = None
        self.sandbox_id = None
        asyncio.get_running_loop().create_task(self._discard(old))

    async def _discard(self, sbx: AsyncSandbox) -> None:
        # A dead sandbox may hold resources on the server until deleted; deleting one
        # that already expired or was deleted is a no-op.
        try:
            await sbx.delete()
        except SandboxError as exc:
            self.log.debug("could not delete gone sandbox %s: %s", sbx.id, exc)
        finally:
            await sbx.close()

    # ------------------------------------------------------------------ cells

    async def run_cell(self, code: str, silent: bool, store_history: bool, out: Output) -> asyncio.Task:
        """Run one cell to its end; the finished task, whose result is the execute reply.

        The cell runs as a task of its own so that an interrupt arriving while no code runs
        in the sandbox yet (server starting, file uploading) can cancel just it; `_cell`,
        which the control thread reads to interrupt, is this object's alone.
        """
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run_cell(code, silent, store_history, out))
        self._cell = _Cell(task, loop)
        try:
            await asyncio.wait({task})
        finally:
            self._cell = None
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
                sbx = await self.ensure(out)
                host = _Host(self, out, sbx)
                for call in calls:
                    await run_magic(call, host)
                if not rest:
                    if silent or not store_history:
                        return ok_reply(self.last_count + 1)
                    # A cell of magics only still takes a number, as in IPython: a no-op in
                    # the sandbox advances its count, which stays the one source of numbers.
                    rest = "pass"
                return await self._execute(sbx, rest, silent, store_history, out)
            except (SandboxGone, SandboxNotFound) as exc:
                # Nothing of the cell ran in a gone sandbox: run it whole in a new one.
                if replaced:
                    raise CellFailure("SandboxGone", exc.message) from None
                replaced = True
                self.mark_gone(exc.message)
            except ServerUnavailable as exc:
                if exc.sent and exc.status != 503:
                    # The request may have reached the server: sending it again could
                    # run the cell twice.
                    raise CellFailure("ServerUnavailable", exc.message) from None
                if deadline is None:
                    deadline = time.monotonic() + self.settings.reconnect_timeout
                    out.stream("stderr", "sandbox server unreachable, retrying…\n")
                await self._wait_for_server(exc, deadline)
            except SandboxError as exc:
                raise CellFailure(type(exc).__name__, exc.message) from None

    async def _run_host_cell(self, code: str, out: Output) -> dict[str, t.Any]:
        """A ``%%host`` cell: run here, in the kernel's process (see kernel/host.py)."""
        if not host_cells_enabled():
            raise CellFailure("HostCellsDisabled", "%%host cells are switched off for this kernel "
                                "(SANDBOX_KERNEL_HOST_CELLS=0); every cell runs in the sandbox")
        count = self.last_count + 1
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
        if self.embedded:
            # Our own server went away: start it again (the sandboxes outlive it).
            try:
                await self._start_server_if_ours()
            except ServerStartError as err:
                raise CellFailure("ServerUnavailable", str(err)) from None
        else:
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    async def _execute(
        self, sbx: AsyncSandbox, code: str, silent: bool, store_history: bool, out: Output
    ) -> dict[str, t.Any]:
        mapper = CellMapper(execution_count=self.last_count + 1, passthrough=self.outputs_passthrough)
        on_event = self._event_handler(sbx, mapper, out)
        cell = self._cell
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
            )
        finally:
            if cell is not None:
                cell.remote = False
        owed, reply = mapper.finish()
        reply["payload"] = reply_payload(execution.payload, self.outputs_passthrough)
        if reply["status"] == "ok":
            reply["user_expressions"] = reply_user_expressions(execution.user_expressions, self.outputs_passthrough)
        for msg_type, content in owed:
            out.send(msg_type, content)
        if execution.execution_count is not None:
            self.last_count = execution.execution_count
        if mapper.sandbox_gone:
            self.mark_gone(died_reason(mapper.done or {}))
        out.text_result = mapper.text_result
        return reply

    def _event_handler(self, sbx: AsyncSandbox, mapper: CellMapper, out: Output):
        """The sandbox events of one request -> IOPub messages, comm messages through the
        widget rules, and input() answered through the frontend."""

        async def on_event(event: dict[str, t.Any]) -> None:
            kind = event.get("type")
            if kind == V.INPUT_REQUEST:
                await self._answer_input(sbx, event, out)
            elif kind in V.COMM_MESSAGES:
                message = self.comms.to_page(event)
                if message is not None:
                    out.comm(message)
            else:
                for msg_type, content in mapper.feed(event):
                    out.send(msg_type, content)

        return on_event

    async def _answer_input(self, sbx: AsyncSandbox, event: dict[str, t.Any], out: Output) -> None:
        """Ask the frontend (its stdin channel) and hand the answer to the waiting cell. An
        interrupt cancels the question: the cell itself is interrupted in the sandbox."""
        cell = self._cell
        question = asyncio.ensure_future(out.ask_input(str(event.get("prompt", "")), bool(event.get("password"))))
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
        sbx = await self.current()
        if sbx is None:
            return  # no sandbox (yet, or any more): nothing holds the other end of the comm
        self.comms.from_page(msg_type, content)
        mapper = CellMapper(passthrough=self.outputs_passthrough)
        self.comms_in_flight += 1
        try:
            await sbx.send_comm(
                msg_type, str(content.get("comm_id", "")), content.get("data") or {},
                metadata=metadata or None, buffers=[base64.b64encode(bytes(b)).decode("ascii") for b in buffers] or None,
                target_name=content.get("target_name"), msg_id=out.msg_id,
                timeout_seconds=self.settings.execute_timeout, on_event=self._event_handler(sbx, mapper, out))
        except (SandboxGone, SandboxNotFound) as exc:
            self.mark_gone(exc.message)
        except SandboxError as exc:
            self.log.warning("a comm message did not reach the sandbox: %s", exc)
        finally:
            self.comms_in_flight -= 1
        if mapper.sandbox_gone:
            self.mark_gone(died_reason(mapper.done or {}))

    # ------------------------------------------------------------------ control thread

    async def interrupt(self) -> None:
        """Interrupt the running cell: in the sandbox if the code runs there, else the
        kernel's own part of it (waiting for the server, uploading a file)."""
        cell = self._cell
        if cell is None:
            if self.comms_in_flight:
                await self._interrupt_remote()  # a widget's handler running long
            return
        if cell.waiting is not None:
            cell.loop.call_soon_threadsafe(cell.waiting.cancel)
        sid, config = self.sandbox_id, self.server_config
        if cell.remote and sid and config is not None:
            sbx = AsyncSandbox(sid, config=config, timeout=CONTROL_TIMEOUT)
            try:
                deadline = time.monotonic() + 3.0
                # The execute request may not have reached the sandbox's runtime yet
                # ("nothing running"): try again briefly rather than lose the interrupt.
                while cell is self._cell and cell.remote:
                    try:
                        if await sbx.interrupt():
                            return
                    except SandboxError as exc:
                        self.log.warning("interrupt via the server failed: %s", exc)
                        break
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
                else:
                    return
            finally:
                await sbx.close()
        # Cancelling the cell also closes its execute stream, which makes the server
        # interrupt the cell: the fallback when the interrupt call did not get through.
        cell.loop.call_soon_threadsafe(cell.task.cancel)

    async def _interrupt_remote(self) -> None:
        async with self._control_client() as sbx:
            if sbx is not None:
                try:
                    await sbx.interrupt()
                except SandboxError as exc:
                    self.log.warning("interrupt via the server failed: %s", exc)

    @contextlib.asynccontextmanager
    async def _control_client(self) -> t.AsyncIterator[AsyncSandbox | None]:
        """A client of its own for the control thread (see the module's docstring), closed
        after use, never deleting the sandbox; None when there is no sandbox."""
        sid, config = self.sandbox_id, self.server_config
        if not sid or config is None:
            yield None
            return
        sbx = AsyncSandbox(sid, config=config, timeout=CONTROL_TIMEOUT)
        try:
            yield sbx
        finally:
            await sbx.close()

    async def shutdown(self) -> None:
        """Delete the sandbox, including one still being created."""
        self.shutting_down = True
        deadline = time.monotonic() + 10.0
        while self._creations_in_flight and self.sandbox_id is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        async with self._control_client() as sbx:
            if sbx is None:
                return
            try:
                await sbx.delete()
            except SandboxError as exc:
                self.log.warning("could not delete sandbox %s: %s", sbx.id, exc)
        self.sandbox_id = None

    def delete_now(self) -> None:
        """Blocking delete for a signal handler, where no event loop can be relied on."""
        sid, config = self.sandbox_id, self.server_config
        if not sid or config is None:
            return
        try:
            with httpx.Client(transport=config.endpoint.transport(), headers=config.headers, timeout=3.0) as client:
                client.delete(f"{config.endpoint.base_url}/v1/sandboxes/{sid}")
        except httpx.HTTPError:
            pass
        self.sandbox_id = None
