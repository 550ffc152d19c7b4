"""The request loop of a sandbox: execute, complete, inspect, interrupt, commands.

The main thread runs cells (so SIGINT can interrupt them as it does in a terminal); a
reader thread takes frames off the channel, answers interrupts and starts or signals
commands at once (see commands.py), and queues the rest.
Every event of an execution carries that execution's id, so the supervisor can route late
output (a background thread printing after its cell ended) instead of mixing it into the
next cell.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import sys
import threading
import time
import traceback

from . import egress_forwarder, fitting, framecheck, introspection, saving
from . import vocabulary as V
from .capture import OutputBudget, PipeDrain
from .commands import CommandRunner
from .display import bundle_fields, clean_bundle, clean_metadata
from .frontend import InputChannel, comm_message, install_comms
from .protocol import STDIO_CHANNEL, SocketChannel


#: The events that answer a cell, and the slack each gets once per execution past the budget.
CLOSING_EVENTS = frozenset({V.ERROR, V.EXECUTE_RESULT})
CLOSING_SLACK = 8 * 1024
TRANSIENT_LIMIT = 4096  # a display's transient holds its display_id


class Runtime:
    def __init__(self, channel: SocketChannel, output_limit: int):
        self.channel = channel
        self.requests: queue.Queue = queue.Queue()
        self.budget = OutputBudget(output_limit)
        self.frame_limit = framecheck.frame_limit(output_limit)
        self.current: str | None = None  # id of the running execution
        self.interrupt_reason: dict | None = None
        self.main_thread = threading.main_thread().ident
        self.shell = None
        self.drains: dict[str, PipeDrain] = {}
        self.lock = threading.Lock()
        self.accepted: set[str] = set()  # executes received, not started
        self.cancelled: dict[str, dict] = {}  # ... and interrupted before they started
        self.commands: CommandRunner | None = None
        self.stdin = InputChannel(self)
        self.comm_manager = None  # frontend.install_comms, when the image has `comm`
        self.parent_msg_id: str | None = None  # the frontend's id of the request being run

    # ----------------------------------------------------------------- output
    def send(self, message: dict) -> None:
        try:
            self.channel.send(message)
        except OSError:
            os._exit(70)  # the supervisor is gone: nobody can ever hear from us again

    def send_output(self, message: dict) -> None:
        """Send one output event within the execution's budget: whole, trimmed (marked
        ``truncated``) or, when nothing of it fits, dropped and counted. The cell's answer is
        always sent, even after a flood of prints used the budget up: its first error (if need
        be as its name and a line of its value) and its first result each get a small slack
        of their own, which the supervisor's budget leaves room for (``FRAME_SLACK``)."""
        with self.budget.lock:
            if self.budget.room <= 0 and message.get("type") == V.STREAM:  # spent: not even encoded
                self.budget.dropped += len(message.get("text", "").encode("utf-8", "replace"))
                return
            fitted, data = fitting.fit(message, self.budget.room, self.frame_limit)
            kind = message.get("type")
            if fitted is None and kind in CLOSING_EVENTS and kind not in self.budget.closing_sent:
                fitted, data = fitting.fit(message, CLOSING_SLACK, self.frame_limit)
                if fitted is not None:
                    self.budget.used -= framecheck.frame_cost(len(data))  # paid from the slack, not the budget
            if fitted is None:
                self.budget.dropped += len(fitting.payload(message)) if message.get("type") != V.STREAM \
                    else len(message.get("text", "").encode("utf-8", "replace"))
                self.budget.used = max(self.budget.used, self.budget.limit)  # nothing after a drop
                return
            self.budget.used += framecheck.frame_cost(len(data))
            if fitted is not message and fitted.get("type") == V.STREAM:
                self.budget.dropped += len(message["text"].encode("utf-8", "replace")) \
                    - len(fitted["text"].encode("utf-8", "replace"))
            elif fitted is not message:
                self.budget.cut += 1
                self.budget.used = max(self.budget.used, self.budget.limit)  # what follows a cut is dropped
            if kind in CLOSING_EVENTS:
                self.budget.closing_sent.add(kind)
            self.send_payload(data)

    def send_payload(self, data: bytes) -> None:
        try:
            self.channel.send_payload(data)
        except OSError:
            os._exit(70)

    def send_reply(self, message: dict) -> None:
        """A reply to a request, trimmed when too large to be a frame (a huge help text)."""
        fitted, data = fitting.fit(message, 1 << 62, self.frame_limit)
        if fitted is None:
            fitted, data = None, fitting.payload({"type": V.REPLY, "id": message.get("id"),
                                                  "error": "the answer was too large to send"})
        self.send_payload(data)

    def publish_stream(self, name: str, text: str) -> None:
        with self.budget.lock:
            kept = self.budget.take_stream(text)
        if kept is not None:
            self.send_output(V.stream_event(name, kept, self.current))

    def sync_streams(self) -> None:
        """Forward everything already written to fds 1 and 2 before what comes next."""
        for fd, name in ((1, V.STDOUT), (2, V.STDERR)):
            try:
                (sys.stdout if fd == 1 else sys.stderr).flush()
            except Exception:
                pass
            self.drains[name].sync()

    def publish_display(self, data, metadata, transient, update) -> None:
        self.sync_streams()
        kind = V.UPDATE_DISPLAY_DATA if update else V.DISPLAY_DATA
        self.send_output({"type": kind, "exec": self.current, **bundle_fields(data, metadata, self.frame_limit),
                          "transient": clean_metadata(transient, TRANSIENT_LIMIT)[0]})

    def publish_clear(self, wait: bool) -> None:
        self.sync_streams()
        self.send_output({"type": V.CLEAR_OUTPUT, "exec": self.current, "wait": bool(wait)})

    def publish_result(self, count, data, metadata) -> None:
        self.sync_streams()
        self.send_output({"type": V.EXECUTE_RESULT, "exec": self.current, "execution_count": count,
                          **bundle_fields(data, metadata, self.frame_limit)})

    def publish_error(self, etype, evalue, stb) -> None:
        self.sync_streams()
        ename, text = getattr(etype, "__name__", str(etype)), str(evalue)
        reason = self.interrupt_reason
        if etype is KeyboardInterrupt and reason and reason.get("reason") == "timeout":
            ename = "TimeoutError"
            text = (f"the cell ran past its {reason.get('timeout_seconds')} s timeout and was "
                    "interrupted; variables are kept")
            stb = list(stb) + [f"TimeoutError: {text}"]
        self.last_error = (ename, text)
        self.send_output(V.error_event(ename, text, list(stb), self.current))

    # ---------------------------------------------------------------- control
    def read_requests(self) -> None:
        while True:
            try:
                message = self.channel.recv()
            except Exception:
                os._exit(71)  # channel closed: the supervisor ended, so do we
            if message.get("op") == V.OP_INTERRUPT:
                self.interrupt(message)
            elif message.get("op") in (V.OP_COMMAND, V.OP_COMMAND_SIGNAL):
                self.commands.handle(message)  # here, not queued: the main thread may be in a cell
            elif message.get("op") == V.OP_INPUT_REPLY:
                self.stdin.answer(message)  # here: the main thread waits in input()
            else:
                if message.get("op") in (V.OP_EXECUTE, V.OP_COMM):
                    with self.lock:
                        self.accepted.add(message.get("exec"))
                self.requests.put(message)

    def interrupt(self, message: dict) -> None:
        """Interrupt the running cell, or cancel one that arrived but has not started yet
        (otherwise an interrupt sent right after an execute would be lost)."""
        target = message.get("exec")
        with self.lock:
            running = self.current is not None and target in (None, self.current)
            if running:
                self.interrupt_reason = message
                signal.pthread_kill(self.main_thread, signal.SIGINT)
            elif target in self.accepted:
                self.cancelled[target] = message
                running = True
        self.send({"type": V.REPLY, "id": message.get("id"), "interrupted": running})

    # -------------------------------------------------------------- requests
    def serve(self) -> None:
        while True:
            try:
                message = self.requests.get()
                handler = getattr(self, "do_" + str(message.get("op")), None)
                if handler is None:
                    self.send({"type": V.REPLY, "id": message.get("id"),
                               "error": f"unknown op {message.get('op')!r}"})
                    continue
                handler(message)
            except KeyboardInterrupt:
                continue  # an interrupt that arrived just after its cell ended

    def do_ping(self, message: dict) -> None:
        self.send({"type": V.REPLY, "id": message.get("id"), "ok": True})

    def do_sync(self, message: dict) -> None:
        os.sync()
        self.send({"type": V.REPLY, "id": message.get("id"), "ok": True})

    def do_save(self, message: dict) -> None:
        """Save the user namespace by value (saving.py); a refusal is a note, never a loss."""
        self.send_reply(saving_request(saving.save, self.shell, message,
                                       int(message.get("max_bytes") or 0), float(message.get("seconds") or 60)))

    def do_restore(self, message: dict) -> None:
        self.send_reply(saving_request(saving.restore, self.shell, message))

    def do_execute(self, message: dict) -> None:
        def run() -> bool:
            result = self.shell.run_cell(
                message.get("code", ""),
                store_history=bool(message.get("store_history", True)),
                silent=bool(message.get("silent", False)),
            )
            return result.success

        self._run_request(message, run)

    def do_comm(self, message: dict) -> None:
        """A comm message from the frontend (a slider moved): its handlers run as a cell would,
        their output and comm messages being this request's events."""
        def run() -> bool:
            handler = getattr(self.comm_manager, str(message.get("msg_type")), None)
            if self.comm_manager is None or message.get("msg_type") not in V.COMM_MESSAGES:
                raise RuntimeError("this sandbox's image has no comm support (install ipywidgets)")
            handler(None, None, comm_message(message))
            return True

        self._run_request(message, run)

    def _run_request(self, message: dict, run) -> None:
        """Run ``run`` (a cell, or a comm message's handlers) as execution ``message["exec"]``:
        its output is sent as that execution's events, then one ``done``."""
        exec_id = message["exec"]
        limit = message.get("stream_limit")
        self.budget.reset(limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None)
        self.interrupt_reason = None
        self.last_error = None
        started = time.monotonic()
        with self.lock:
            self.accepted.discard(exec_id)
            cancelled = self.cancelled.pop(exec_id, None)
            self.current = exec_id
        self.parent_msg_id = str(message.get("msg_id") or "") or None
        self.stdin.allowed = bool(message.get("allow_stdin"))
        status = V.OK
        extra: dict = {}
        try:
            if cancelled is not None:
                self.interrupt_reason = cancelled
                raise KeyboardInterrupt
            if not run():
                status = V.ERROR
            extra = self.reply_extras(message.get("user_expressions") if status == V.OK else None)
        except KeyboardInterrupt:
            status = V.ERROR
            self.publish_error(KeyboardInterrupt, KeyboardInterrupt(), ["KeyboardInterrupt"])
        except BaseException as exc:  # the shell itself failed; report, stay alive
            status = V.ERROR
            self.publish_error(type(exc), exc, traceback.format_exception(exc))
        finally:
            self.stdin.allowed = False
        try:
            self.sync_streams()
        except KeyboardInterrupt:
            self.sync_streams()
        if self.budget.truncated:
            self.send(V.stream_event(V.STDERR, truncation_note(self.budget), exec_id, note=True))
        reason = None
        if self.interrupt_reason is not None:
            reason = V.TIMEOUT_INTERRUPTED if self.interrupt_reason.get("reason") == "timeout" else V.INTERRUPTED
        self.current = None
        self.parent_msg_id = None
        done = V.done_event(status, execution_count=self.shell.execution_count - 1,
                            duration=round(time.monotonic() - started, 6),
                            truncated=self.budget.truncated, reason=reason, exec_id=exec_id, **extra)
        fitted, data = fitting.fit(done, 1 << 62, self.frame_limit)
        if fitted is None:  # payloads too large for a frame: the done without them
            done.pop("payload", None)
            done.pop("user_expressions", None)
            data = fitting.payload(done)
        self.send_payload(data)

    def reply_extras(self, expressions) -> dict:
        """What ipykernel's execute reply adds: the payloads the cell left (pager text from
        ``?``, ``%load``'s next input) and its user_expressions, evaluated after the cell."""
        extra: dict = {}
        payloads = []
        for item in self.shell.payload_manager.read_payload():
            item = clean_metadata(item, self.frame_limit // 2)[0]
            if item.get("source") == "page":
                item["data"] = clean_bundle(item.get("data") or {}, self.frame_limit // 2)[0]
            payloads.append(item)
        self.shell.payload_manager.clear_payload()
        if payloads:
            extra["payload"] = payloads
        if isinstance(expressions, dict) and expressions:
            values = self.shell.user_expressions(
                {str(k): str(v) for k, v in list(expressions.items())[:V.USER_EXPRESSIONS_MAX]})
            extra["user_expressions"] = {
                key: {**clean_metadata(value, self.frame_limit // 4)[0],
                      "data": clean_bundle(value.get("data") or {}, self.frame_limit // 4)[0]}
                if value.get("status") == V.OK else clean_metadata(value, self.frame_limit // 4)[0]
                for key, value in values.items()}
        return extra

    def publish_comm(self, event: dict) -> None:
        self.sync_streams()
        self.send_output(event)

    def do_complete(self, message: dict) -> None:
        self.send_reply(introspection.complete(self.shell, message))

    def do_inspect(self, message: dict) -> None:
        self.send_reply(introspection.inspect(self.shell, message, self.frame_limit))

    def do_is_complete(self, message: dict) -> None:
        self.send_reply(introspection.is_complete(self.shell, message))


def saving_request(work, shell, message: dict, *args) -> dict:
    """Run a save or restore on ``message["path"]`` (under /workspace) and make its reply."""
    reply = {"type": V.REPLY, "id": message.get("id")}
    path = os.path.join("/workspace", str(message.get("path") or ""))
    try:
        reply.update(ok=True, saved_state=work(shell, path, *args))
    except saving.SaveRefused as exc:
        reply["error"] = str(exc)
    except KeyboardInterrupt:
        reply["error"] = "interrupted"
    except BaseException as exc:  # the user's objects failed to pickle or load: say how
        reply["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    return reply


def setup_matplotlib(preload: list[str]) -> None:
    """Inline PNG figures, as ipykernel does, with the font cache the image prebuilt."""
    cache, config = os.environ.get("SANDBOX_MPLCACHE"), os.environ.get("MPLCONFIGDIR")
    if cache and config and os.path.isdir(cache):
        import shutil

        shutil.copytree(cache, config, dirs_exist_ok=True)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    if "matplotlib" in preload or "matplotlib.pyplot" in preload:
        import matplotlib.pyplot  # noqa: F401  (registers the inline backend with the shell)


def _text_stream(fd: int):
    """Unbuffered text on a captured fd, so a print shows while the cell still runs."""
    import io

    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)


def _close_inherited_fds(keep: set[int]) -> None:
    """Close every fd bwrap passed on but the runtime does not use, before any user code runs.

    Only the channel is meant to cross into the sandbox. Should any other fd ever leak in (an
    fd of a host path would be a door: ``/proc/self/fd/N/..`` walks the host's tree), it is
    closed here, before the first cell.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own, already closed


def _open_channel(arg: str) -> SocketChannel:
    """The channel named by the runtime's argument: a socket's fd (bwrap), or ``stdio``.

    Under gVisor the channel is the container's stdin (requests) and stdout (frames): a
    host socket passed in would make a checkpoint fail, host pipes are re-attached on
    restore. They move off fds 0 and 1, which then read /dev/null and feed the capture pipes.
    """
    if arg != STDIO_CHANNEL:
        return SocketChannel.from_fd(int(arg))
    read_fd, write_fd = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    return SocketChannel.from_pipes(read_fd, write_fd)


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def truncation_note(budget: OutputBudget) -> str:
    """What the cell is told when its output did not all fit: how much was dropped and how
    to get all of it (a file in /workspace, which a notebook's %pull brings home)."""
    parts = []
    if budget.stream_dropped:
        parts.append(f"{_size(budget.stream_dropped)} of text past the first {_size(budget.stream_limit or 0)} "
                     "were dropped")
    if budget.dropped:
        parts.append(f"{budget.dropped} bytes over the {budget.limit} byte limit per execution were dropped")
    if budget.cut:
        parts.append(f"{budget.cut} outputs were cut to fit")
    return (f"\n[sandbox: output truncated: {'; '.join(parts)}. To keep all of it, write it to a file in "
            "/workspace (with open('out.txt', 'w') as f: print(..., file=f)) and download it (in a notebook: "
            "%pull out.txt)]\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _close_inherited_fds({int(argv[0])} if argv and argv[0].isdigit() else set())
    diag = os.dup(2)
    try:
        _main(argv, diag)
    except BaseException:
        os.write(diag, traceback.format_exc().encode("utf-8", "replace"))
        os._exit(1)


def _main(argv: list[str], diag: int) -> None:
    # Commands start from the environment the sandbox booted with, not from what cells do
    # to os.environ later; the runtime's own settings are not theirs.
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    output_limit = int(os.environ.get("SANDBOX_OUTPUT_LIMIT", str(10 * 1024 * 1024)))
    preload = [m for m in os.environ.get("SANDBOX_PRELOAD", "").split(",") if m]

    # Keep the runtime's own diagnostics (fatal errors) on the original stderr, which the
    # supervisor logs; user output goes through the capture pipes.
    faulthandler.enable(file=os.fdopen(diag, "w", closefd=False))
    # The supervisor ignores SIGINT and that disposition is inherited through bwrap; Python
    # then installs no KeyboardInterrupt handler, so interrupts would be silently ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    channel = _open_channel(argv[0])
    egress_forwarder.start_from_environment()  # HTTP(S)_PROXY on loopback, when the sandbox has egress
    runtime = Runtime(channel, output_limit)
    runtime.commands = CommandRunner(runtime.send, base_env, output_limit)
    runtime.drains = {
        V.STDOUT: PipeDrain(1, V.STDOUT, runtime.publish_stream),
        V.STDERR: PipeDrain(2, V.STDERR, runtime.publish_stream),
    }
    for drain in runtime.drains.values():
        drain.start()
    sys.stdout = _text_stream(1)
    sys.stderr = _text_stream(2)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr

    from .shell import make_shell

    runtime.shell = make_shell(runtime)
    runtime.stdin.install()
    runtime.comm_manager = install_comms(runtime)
    os.chdir(os.environ.get("SANDBOX_WORKDIR", "/workspace"))
    setup_matplotlib(preload)
    failed = []
    for module in preload:
        try:
            __import__(module)
        except Exception as exc:
            failed.append(f"{module}: {exc}")
    runtime.sync_streams()
    threading.Thread(target=runtime.read_requests, name="requests", daemon=True).start()
    runtime.send({"type": V.READY, "pid": os.getpid(), "python": sys.version.split()[0],
                  "preloaded": [m for m in preload if m in sys.modules], "preload_failed": failed})
    runtime.serve()
