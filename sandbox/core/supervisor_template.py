"""The server's side of the supervisor template (``sandbox/supervisor/template.py``): started
once at start-up, asked for a forked supervisor by each ``Launcher.start_supervisor``, ended
with the server.

A supervisor forked from the template starts without an interpreter's start-up and imports,
and shares their memory with every other. The server handles it by pid, as it does one a
previous server started (re-adoption): it is the template's child, not the server's, so
there is no ``Popen`` to wait for. Whenever the template is not there (not started, turned
off with ``supervisor_template``, exited, or it answered with an error) the caller starts
the supervisor as before, with its own ``Popen``: a sandbox never waits on the template.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading

from ..common.paths import open_private_log
from ..supervisor import template

log = logging.getLogger("sandbox.core.manager")

# How long one fork may take before the template counts as failed (its first request also
# waits for its imports: 0.2-1 s, more on a loaded host).
ANSWER_SECONDS = 60.0
STOP_SECONDS = 5.0


class SupervisorTemplate:
    def __init__(self, log_path: str):
        self.log_path = log_path  # the template's own stdout and stderr (its children get their sandbox's)
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()  # one request at a time on the socket
        self.failure_said = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        """Started and not failed (it may still be importing: a fork then waits for that)."""
        return self.sock is not None

    def start(self, env: dict[str, str]) -> None:
        """Start the template (it imports in the background: the first fork waits for that,
        never the server's start-up). ``env``: a supervisor's environment."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # both close-on-exec
        try:
            with open_private_log(self.log_path) as log_file:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", template.MODULE], stdin=theirs, stdout=log_file, stderr=log_file,
                    start_new_session=True, env=env, cwd="/")
        except OSError as exc:
            ours.close()
            self._failed(f"it could not start: {exc}")
            return
        finally:
            theirs.close()
        ours.settimeout(ANSWER_SECONDS)
        self.sock = ours

    def fork(self, sandbox_dir: str, ready_fd: int, log_fd: int, args: list[str]) -> int | None:
        """A supervisor for ``sandbox_dir`` forked by the template (its pid), or None: the
        caller then starts one itself. Blocking: call it off the event loop."""
        with self.lock:
            if self.sock is None:
                return None
            try:
                return template.ask_fork(self.sock, sandbox_dir, ready_fd, log_fd, args)
            except (OSError, template.TemplateError) as exc:
                self._failed(str(exc) or type(exc).__name__)
                self._close()
                return None

    def stop(self) -> None:
        """End the template (closing our end is its signal to exit); its children run on."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.process is not None:
            try:
                self.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def _failed(self, why: str) -> None:
        """Said once: from here on every supervisor starts as its own process."""
        if not self.failure_said:
            self.failure_said = True
            log.warning("the supervisor template failed (%s); supervisors start as their own processes "
                        "from now on (see %s)", why, self.log_path)
