"""Commands: programs a sandbox runs beside its interpreter (``pytest``, ``ls``, ``make``).

A command is a child of the runtime, so it is in the sandbox in every way that matters:
the same uid, ``/workspace``, cgroup and rlimits (inherited), seccomp filter (inherited)
and network (none). What it does not share with the interpreter:

- its session and process group: a signal for the command (interrupt, timeout) reaches
  it and everything it started, never the interpreter; and the interpreter's SIGINT
  never reaches the command;
- its stdout and stderr: pipes of its own, read by a thread of its own, so a command's
  output never mixes with a cell's, and a command can run while a cell runs;
- its environment: the one the sandbox booted with (plus what the request adds), not
  whatever cells have since put in ``os.environ``.

When the command's own process exits, its process group is killed (a ``cmd &`` left
behind would otherwise hold the pipes open and the request with them); output still in
the pipes is read for a moment more, then the command is reported done. A process that
left the group (``setsid``) lives on in the sandbox, unheard, until the sandbox ends.

This module runs inside the sandbox: standard library only.
"""

from __future__ import annotations

import base64
import codecs
import errno
import os
import selectors
import signal
import subprocess
import threading
import time

from . import vocabulary as V
from .capture import OutputBudget

READ_CHUNK = 65536
EXIT_DRAIN_SECONDS = 0.5  # output still in the pipes after the process exited
POLL_SECONDS = 0.1
SIGNALS = {V.SIGNAL_INTERRUPT: signal.SIGINT, V.SIGNAL_TERMINATE: signal.SIGTERM, V.SIGNAL_KILL: signal.SIGKILL}


class Command:
    """One running program: its process, the signals sent to it, its output budget."""

    def __init__(self, command_id: str, proc: subprocess.Popen, output_limit: int):
        self.id = command_id
        self.proc = proc
        self.budget = OutputBudget(output_limit)
        self.lock = threading.Lock()
        self.reaped = False  # once true, the pid (and so the group id) may name someone else

    def signal(self, signum: int) -> bool:
        """Signal the command's process group while its leader is unreaped (a zombie
        leader keeps the group id from being reused, so the signal cannot go astray)."""
        with self.lock:
            if self.reaped:
                return False
            try:
                os.killpg(self.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                return False
            return True

    def exited(self) -> bool:
        """Whether the leader exited, without reaping it (WNOWAIT)."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def reap(self) -> int:
        with self.lock:
            code = self.proc.wait()
            self.reaped = True
            return code


class CommandRunner:
    """Starts commands on request and reports their output and end as frames.

    Called from the runtime's request-reader thread, never the main thread, which may be
    busy running a cell: a command starts at once whatever the interpreter is doing.
    """

    def __init__(self, send, base_env: dict[str, str], output_limit: int):
        self.send = send
        self.base_env = dict(base_env)
        self.output_limit = output_limit
        self.running: dict[str, Command] = {}
        # Commands asked for but not spawned yet, with the signal that came meanwhile (a
        # timeout of 0.1 s, or an interrupt right after the start, must not be lost).
        self.starting: dict[str, int | None] = {}
        self.lock = threading.Lock()

    def handle(self, message: dict) -> None:
        op = message.get("op")
        if op == V.OP_COMMAND:
            with self.lock:
                self.starting[message.get("exec")] = None
            threading.Thread(target=self._run, args=(message,), name=f"command-{message.get('exec')}",
                             daemon=True).start()
        elif op == V.OP_COMMAND_SIGNAL:
            signum = SIGNALS.get(message.get("signal"))
            with self.lock:
                command = self.running.get(message.get("exec"))
                if command is None and message.get("exec") in self.starting and signum is not None:
                    self.starting[message["exec"]] = signum
            if command is not None and signum is not None:
                command.signal(signum)

    # ------------------------------------------------------------------ one command
    def _run(self, message: dict) -> None:
        command_id = message.get("exec")
        started = time.monotonic()
        env = dict(self.base_env)
        env.update(message.get("env") or {})
        stdin = base64.b64decode(message["stdin"]) if message.get("stdin") is not None else None
        try:
            proc = subprocess.Popen(
                list(message["argv"]), cwd=message.get("cwd") or "/workspace", env=env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            with self.lock:
                self.starting.pop(command_id, None)
            self._spawn_failed(command_id, message, exc, started)
            return
        command = Command(command_id, proc, self.output_limit)
        with self.lock:
            self.running[command_id] = command
            early = self.starting.pop(command_id, None)
        if early is not None:
            command.signal(early)
        try:
            if stdin is not None:
                threading.Thread(target=_feed, args=(proc.stdin, stdin), name=f"stdin-{command_id}",
                                 daemon=True).start()
            self._pump(command)
            code = command.reap()
        finally:
            with self.lock:
                self.running.pop(command_id, None)
        if command.budget.dropped:
            self.send(V.stream_event(V.STDERR, f"\n[sandbox: output truncated: {command.budget.dropped} bytes over "
                                               f"the {command.budget.limit} byte limit per command were dropped]\n",
                                     command_id))
        self.send({"type": V.COMMAND_DONE, "exec": command_id,
                   "exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
                   "duration": round(time.monotonic() - started, 6),
                   "truncated": bool(command.budget.dropped), "error": None})

    def _pump(self, command: Command) -> None:
        """Forward stdout and stderr as they come until both close, or until the process
        exited and what it left in the pipes is read."""
        selector = selectors.DefaultSelector()
        decoders = {}
        for name, pipe in ((V.STDOUT, command.proc.stdout), (V.STDERR, command.proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe.fileno(), selectors.EVENT_READ, name)
            decoders[name] = codecs.getincrementaldecoder("utf-8")("replace")
        drain_until = None
        try:
            while selector.get_map():
                if drain_until is None and command.exited():
                    command.signal(signal.SIGKILL)  # what it left running in its group
                    drain_until = time.monotonic() + EXIT_DRAIN_SECONDS
                if drain_until is not None and time.monotonic() >= drain_until:
                    break
                for key, _ in selector.select(POLL_SECONDS):
                    try:
                        data = os.read(key.fd, READ_CHUNK)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if not data:
                        selector.unregister(key.fd)
                    self._forward(command, key.data, decoders[key.data], data)
        finally:
            selector.close()
            command.proc.stdout.close()
            command.proc.stderr.close()

    def _forward(self, command: Command, name: str, decoder, data: bytes) -> None:
        allowed = command.budget.take(len(data)) if data else 0
        text = decoder.decode(data[:allowed], final=not data)
        if text:
            self.send(V.stream_event(name, text, command.id))

    def _spawn_failed(self, command_id: str, message: dict, exc: OSError, started: float) -> None:
        """No process ran: say why the way a shell would (127 not found, 126 otherwise)."""
        cwd = message.get("cwd") or "/workspace"
        if exc.filename == cwd or not os.path.isdir(cwd):
            what = f"cannot change to the working directory {cwd}: {exc.strerror or exc}"
        else:
            what = f"cannot run {message['argv'][0]!r}: {exc.strerror or exc}"
        code = 127 if exc.errno == errno.ENOENT and os.path.isdir(cwd) else 126
        self.send(V.stream_event(V.STDERR, f"sandbox: {what}\n", command_id))
        self.send({"type": V.COMMAND_DONE, "exec": command_id, "exit_code": code, "signal": None,
                   "duration": round(time.monotonic() - started, 6), "truncated": False, "error": what})


def _feed(pipe, data: bytes) -> None:
    """Write stdin and close it; a command that exits without reading it is no error."""
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass
