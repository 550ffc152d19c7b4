"""ADK (google-adk) over our sandboxes: a code executor and function tools.

``pip install 'sandbox-kernel[adk]'``, then::

    from google.adk.agents import LlmAgent
    from sandbox.agents.adk import SandboxCodeExecutor

    agent = LlmAgent(name="analyst", model=..., code_executor=SandboxCodeExecutor())

`SandboxCodeExecutor` is stateful by default: ADK's ``execution_id`` (the session id) maps
to one sandbox, created on first use and kept alive by use (every run renews its TTL), so
``df`` loaded in one turn is still there in the next. It ends when the application calls
``end_session(session_id)`` (or ``close()`` for all), or by its TTL if nobody does: ADK has
no "session ended" hook for code executors, and an abandoned sandbox must not live on.

ADK calls ``execute_code`` synchronously in a worker thread (``asyncio.to_thread``). The
executor keeps its sandboxes on an event loop of its own, in a thread of its own, and
drives them with the async client: a run never blocks ADK's event loop, and the awaitable
methods (``aend_session``, ``ainterrupt``, ``aclose``) only wait on a future.

What a run returns follows ADK's rules (see ``transcript``): ``stderr`` only for a real
error (ADK counts any stderr as a failed attempt and stops after ``error_retry_attempts``);
a timeout or an interrupt interrupts the cell and keeps the interpreter and its variables;
``output_files`` are the files the code created or changed in /workspace plus the figures
it displayed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import mimetypes
import secrets
import threading
import typing as t
from dataclasses import dataclass, field

from google.adk.code_executors import BaseCodeExecutor
from google.adk.code_executors.code_execution_utils import CodeExecutionInput, CodeExecutionResult, File
from google.adk.tools import FunctionTool
from pydantic import Field, PrivateAttr

from ..client import (AsyncSandbox, FileInfo, InvalidRequest, Sandbox, SandboxError, SandboxGone, SandboxNotFound,
                      resolve)
from ..runtime import vocabulary as V
from .transcript import MAX_TEXT_CHARS, READ_MAX_BYTES, Transcript, agent_usage, cap, read_refusal

__all__ = ["SandboxCodeExecutor", "sandbox_tools"]

log = logging.getLogger(__name__)

if t.TYPE_CHECKING:
    from google.adk.agents.invocation_context import InvocationContext

# A stateless executor (no execution_id) runs each call in a sandbox of its own.
_NO_SESSION = ""


@dataclass
class _Session:
    """One ADK session's sandbox and what has been pushed into it (name -> sha256)."""

    sandbox: AsyncSandbox
    pushed: dict[str, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _LoopThread:
    """An event loop running in a daemon thread: where every sandbox of one executor lives
    (an AsyncSandbox belongs to the loop it is first used on)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandbox-adk-executor", daemon=True)
        self.thread.start()

    def submit(self, coro: t.Coroutine[t.Any, t.Any, t.Any]) -> "asyncio.Future[t.Any]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[return-value]

    def run(self, coro: t.Coroutine[t.Any, t.Any, t.Any]) -> t.Any:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("called from the executor's own event loop: await the async method instead")
        return self.submit(coro).result()

    async def arun(self, coro: t.Coroutine[t.Any, t.Any, t.Any]) -> t.Any:
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


def _content_bytes(file: File) -> bytes:
    """ADK's File holds base64 text or raw bytes (its own get_content_as_bytes reads them so)."""
    if isinstance(file.content, bytes):
        return file.content
    import base64

    return base64.b64decode(file.content)


class SandboxCodeExecutor(BaseCodeExecutor):
    """Runs the model's code in sandboxes of a sandbox-kernel server.

    ``url``/``token`` default to SANDBOX_KERNEL_URL / SANDBOX_KERNEL_TOKEN (or the local
    server's token file), as for the Python client. ``scope`` labels its sandboxes on the
    server (sandbox/service/scopes.py; default a new ``adk-XXXXXXXX`` per executor), and its
    requests reach no sandbox of another scope: not the user's notebook, not another agent's. ``timeout_seconds`` (ADK's field) is the
    per-run timeout: the cell is interrupted, its variables kept.
    """

    stateful: bool = True
    image: str | None = None
    ttl_seconds: int = 1800
    memory_mb: int | None = None
    cpus: float | None = None
    url: str | None = None
    token: str | None = Field(default=None, repr=False, exclude=True)
    scope: str = Field(default_factory=lambda: f"adk-{secrets.token_hex(4)}")
    max_output_files: int = 20
    max_output_file_bytes: int = 20 * 1024 * 1024
    max_output_chars: int = MAX_TEXT_CHARS

    _loop: _LoopThread | None = PrivateAttr(default=None)
    _sessions: dict[str, _Session] = PrivateAttr(default_factory=dict)
    _guard: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _creating: asyncio.Lock | None = PrivateAttr(default=None)

    # ------------------------------------------------------------------ ADK's entry point

    def execute_code(
        self, invocation_context: "InvocationContext", code_execution_input: CodeExecutionInput
    ) -> CodeExecutionResult:
        execution_id = (code_execution_input.execution_id or _NO_SESSION) if self.stateful else _NO_SESSION
        return self._runner().run(
            self._execute(execution_id, code_execution_input.code, list(code_execution_input.input_files))
        )

    # ------------------------------------------------------------------ the application's

    def sandbox_id(self, execution_id: str) -> str | None:
        """The id of the sandbox serving this session, if it has one (for logs and tests)."""
        session = self._sessions.get(execution_id)
        return session.sandbox.id if session else None

    def end_session(self, execution_id: str) -> bool:
        """Delete the session's sandbox (call it where the application ends the ADK session);
        False if it had none."""
        return self._runner().run(self._end(execution_id))

    async def aend_session(self, execution_id: str) -> bool:
        return await self._runner().arun(self._end(execution_id))

    def interrupt(self, execution_id: str) -> bool:
        """Interrupt the session's running code (KeyboardInterrupt in the cell, variables
        kept); False if nothing was running."""
        return self._runner().run(self._interrupt(execution_id))

    async def ainterrupt(self, execution_id: str) -> bool:
        return await self._runner().arun(self._interrupt(execution_id))

    def close(self) -> None:
        """Delete every sandbox this executor made and stop its event loop."""
        with self._guard:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run(self._end_all())
        finally:
            loop.stop()

    async def aclose(self) -> None:
        with self._guard:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            await loop.arun(self._end_all())
        finally:
            await asyncio.to_thread(loop.stop)

    # ------------------------------------------------------------------ on the executor's loop

    def _runner(self) -> _LoopThread:
        with self._guard:
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    async def _create(self) -> AsyncSandbox:
        return await AsyncSandbox.create(
            image=self.image, ttl_seconds=self.ttl_seconds, memory_mb=self.memory_mb, cpus=self.cpus,
            metadata={"client": "adk-code-executor"},
            config=dataclasses.replace(resolve(self.url, self.token), scope=self.scope),
        )

    async def _session(self, execution_id: str) -> _Session:
        if execution_id == _NO_SESSION:
            return _Session(await self._create())
        if self._creating is None:
            self._creating = asyncio.Lock()
        async with self._creating:  # two first runs of one session make one sandbox
            session = self._sessions.get(execution_id)
            if session is None:
                session = self._sessions[execution_id] = _Session(await self._create())
        return session

    async def _execute(self, execution_id: str, code: str, input_files: list[File]) -> CodeExecutionResult:
        session = await self._session(execution_id)
        try:
            async with session.lock:  # one run at a time per session, in arrival order
                return await self._run_in(session, execution_id, code, input_files)
        finally:
            if execution_id == _NO_SESSION:
                await self._delete(session)

    async def _run_in(self, session: _Session, execution_id: str, code: str, input_files: list[File]) -> CodeExecutionResult:
        notes = ""
        try:
            return await self._attempt(session, code, input_files, notes)
        except SandboxGone as exc:
            # Ended by its TTL (or by someone) between two runs: carry on in a new sandbox,
            # and say that the earlier state is gone, so the model does not assume it.
            notes = (f"[note: this session's sandbox had ended ({exc.message}); the code ran in a new "
                     "sandbox: variables and files from earlier runs are gone]\n")
            await session.sandbox.close()
            session.sandbox, session.pushed = await self._create(), {}
            return await self._attempt(session, code, input_files, notes)

    async def _attempt(self, session: _Session, code: str, input_files: list[File], notes: str) -> CodeExecutionResult:
        sbx = session.sandbox
        problems = await self._push(session, input_files)
        if problems:
            return CodeExecutionResult(stdout=notes, stderr=problems, exit_code=1)
        before = await self._snapshot(sbx)
        transcript = Transcript(max_chars=self.max_output_chars)
        execution = await sbx.run_code(code, timeout_seconds=self.timeout_seconds, on_event=transcript.add)
        exit_code, text, error = transcript.finish(execution)
        if error and text:
            # ADK shows the model only stderr of a failed run: keep what it printed before.
            error = cap(f"{text}\n{error}", self.max_output_chars)
        outputs: list[File] = []
        if execution.sandbox_state == V.DEAD:
            # Nothing to read back; the next run of this session starts a new sandbox.
            await self._forget(session)
        else:
            outputs, skipped = await self._changed_files(sbx, before)
            text += skipped
        outputs += [File(name=f.name, content=f.data, mime_type=f.mime_type) for f in transcript.figures]
        return CodeExecutionResult(stdout=cap(notes + text, self.max_output_chars), stderr=error,
                                   output_files=outputs, exit_code=exit_code)

    async def _push(self, session: _Session, files: list[File]) -> str:
        """Push each input file once: ADK re-sends them all on every run, so a file whose
        name and content hash were already pushed into this sandbox is skipped."""
        problems = []
        for file in files:
            try:
                data = _content_bytes(file)
            except ValueError as exc:
                problems.append(f"input file {file.name!r} is not valid base64: {exc}")
                continue
            digest = hashlib.sha256(data).hexdigest()
            if session.pushed.get(file.name) == digest:
                continue
            try:
                await session.sandbox.files.write(file.name, data)
            except SandboxGone:
                raise
            except SandboxError as exc:
                problems.append(f"input file {file.name!r} could not be written to /workspace: {exc.message}")
                continue
            session.pushed[file.name] = digest
        return "".join(p + "\n" for p in problems)

    @staticmethod
    async def _snapshot(sbx: AsyncSandbox) -> dict[str, tuple[int | None, t.Any]]:
        return {f.path: (f.size, f.modified) for f in await sbx.files.list() if f.type == "file"}

    async def _changed_files(self, sbx: AsyncSandbox, before: dict[str, tuple[int | None, t.Any]]) -> tuple[list[File], str]:
        """The files the run created or changed in /workspace (size or mtime moved), each
        read with a byte cap; what did not fit is named in the text instead."""
        try:
            after: list[FileInfo] = [f for f in await sbx.files.list() if f.type == "file"]
        except SandboxError as exc:
            return [], f"[output files not collected: {exc.message}]\n"
        changed = [f for f in after if before.get(f.path) != (f.size, f.modified)]
        files, skipped = [], []
        for info in changed:
            if len(files) >= self.max_output_files:
                skipped.append(f"{info.path} (over the {self.max_output_files} file cap)")
                continue
            if (info.size or 0) > self.max_output_file_bytes:
                skipped.append(f"{info.path} ({info.size} bytes, over the {self.max_output_file_bytes} byte cap)")
                continue
            try:
                data = await sbx.files.read(info.path, max_bytes=self.max_output_file_bytes)
            except InvalidRequest as exc:
                if exc.code != "too_large":
                    raise
                skipped.append(f"{info.path} (grew over the {self.max_output_file_bytes} byte cap)")
                continue
            except SandboxNotFound:
                continue  # removed again meanwhile
            mime = mimetypes.guess_type(info.path)[0] or "application/octet-stream"
            files.append(File(name=info.path, content=data, mime_type=mime))
        note = f"[output files not returned: {', '.join(skipped)}]\n" if skipped else ""
        return files, note

    async def _delete(self, session: _Session) -> None:
        try:
            await session.sandbox.delete()
        except SandboxError as exc:
            log.warning("could not delete sandbox %s: %s", session.sandbox.id, exc)
        finally:
            await session.sandbox.close()

    async def _forget(self, session: _Session) -> None:
        for key, value in list(self._sessions.items()):
            if value is session:
                del self._sessions[key]
        await session.sandbox.close()

    async def _end(self, execution_id: str) -> bool:
        session = self._sessions.pop(execution_id, None)
        if session is None:
            return False
        await self._delete(session)
        return True

    async def _interrupt(self, execution_id: str) -> bool:
        session = self._sessions.get(execution_id)
        if session is None:
            return False
        # A connection of its own: the session's stream is busy with the running cell.
        probe = AsyncSandbox(session.sandbox.id, config=session.sandbox.config)
        try:
            return await probe.interrupt()
        finally:
            await probe.close()

    async def _end_all(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(self._delete(s) for s in sessions), return_exceptions=True)


# --------------------------------------------------------------------------- function tools


def sandbox_tools(sbx: Sandbox | AsyncSandbox, *, timeout_seconds: float | None = 600) -> list[FunctionTool]:
    """ADK function tools over one sandbox: run_code, run_command, read_file, write_file,
    list_files, sandbox_usage and save_state (its variables by value, for
    ``create(from_save=...)``). The sandbox keeps its state between calls; the caller owns its lifetime.
    The tools take no sandbox id: the model reaches this sandbox only. Create it with a
    scoped config (``ServerConfig.scope``) to have the server hold the agent to it as well.

    Give an ``AsyncSandbox`` created on the loop the agent runs on; a sync ``Sandbox`` works
    too (its calls run in worker threads, never on the event loop). ``run_command`` is
    offered only when the client has commands (``sbx.commands``).
    """

    async def call(method: t.Callable[..., t.Any], *args: t.Any, **kwargs: t.Any) -> t.Any:
        if isinstance(sbx, AsyncSandbox):
            return await method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def run_code(code: str, tool_context: t.Any = None) -> dict[str, t.Any]:
        """Run Python code in the sandbox. It is stateful: variables, imports and files
        persist between calls. Returns exit_code (0 = success), stdout (printed text and the
        value of the last expression), stderr (the error, if the code failed) and the names
        of the figures it displayed."""
        transcript = Transcript()
        execution = await call(sbx.run_code, code, timeout_seconds=timeout_seconds, on_event=transcript.add)
        exit_code, text, error = transcript.finish(execution)
        if tool_context is not None:
            from google.genai import types

            for fig in transcript.figures:
                await tool_context.save_artifact(fig.name, types.Part.from_bytes(data=fig.data, mime_type=fig.mime_type))
        return {"exit_code": exit_code, "stdout": text, "stderr": error, "figures": [f.name for f in transcript.figures]}

    async def run_command(command: str, cwd: str = "", timeout: float = 600) -> dict[str, t.Any]:
        """Run a shell command in the sandbox (same /workspace as run_code, no network).
        Returns exit_code, stdout, stderr and timed_out."""
        result = await call(sbx.commands.run, command, cwd=cwd or None, timeout=timeout)
        return {"exit_code": result.exit_code, "stdout": cap(result.stdout), "stderr": cap(result.stderr),
                "timed_out": result.timed_out}

    async def read_file(path: str) -> dict[str, t.Any]:
        """Read a text file from the sandbox's /workspace (path relative to it)."""
        try:
            data = await call(sbx.files.read, path, max_bytes=READ_MAX_BYTES)
        except InvalidRequest as exc:
            if read_refusal(exc) is None:
                raise
            return {"path": path, "error": read_refusal(exc)}
        return {"path": path, "size": len(data), "content": cap(data.decode("utf-8", "replace"))}

    async def write_file(path: str, content: str) -> dict[str, t.Any]:
        """Write a text file into the sandbox's /workspace (path relative to it)."""
        body = await call(sbx.files.write, path, content.encode())
        return {"path": (body or {}).get("path", path), "size": len(content.encode())}

    async def list_files() -> dict[str, t.Any]:
        """List the files in the sandbox's /workspace."""
        files = await call(sbx.files.list)
        return {"files": [{"path": f.path, "size": f.size, "type": f.type} for f in files]}

    async def sandbox_usage() -> dict[str, t.Any]:
        """What the sandbox uses now: CPU seconds, memory now and at its peak, its memory
        limit, and disk used in /workspace (bytes; None before the first sample). Call it
        before loading more data when memory may be near the limit."""
        return agent_usage(await call(sbx.refresh))

    async def save_state(label: str = "") -> dict[str, t.Any]:
        """Save the sandbox's variables by value, so that a later sandbox can start from them
        after this one ends. Returns save_id, and the names saved and lost (open files, sockets,
        threads cannot be saved)."""
        saved = await call(sbx.saves.save, label or None)
        summary = saved.get("summary") or {}
        return {"save_id": saved["id"], "saved": [i["name"] for i in summary.get("saved", [])],
                "lost": summary.get("lost", [])}

    functions: list[t.Callable[..., t.Any]] = [run_code, read_file, write_file, list_files, sandbox_usage, save_state]
    if hasattr(sbx, "commands"):
        functions.insert(1, run_command)
    return [FunctionTool(fn) for fn in functions]
