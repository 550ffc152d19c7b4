"""``serve --daemon``: the server in the background, for a host without systemd.

The same ``serve`` runs as a child in a session of its own (it outlives this command and
the terminal), its output appended to ``STATE/server.log``, its pid in a pid file
(``--pid-file``, default ``STATE/server.pid``, written by the server once it listens and
removed when it stops) that an init script or ``start-stop-daemon --pidfile`` reads.
This command returns once the server answers on its socket, or fails with the log's last
lines. ``sandbox-kernel stop`` ends it, as any server of the state directory.
"""

from __future__ import annotations

import os
import sys

from ..common.paths import StateDir
from .common import error

PID_FILE_NAME = "server.pid"
LOG_NAME = "server.log"
# A first start builds the default image (1-2 min, more on a loaded host) before it listens.
START_TIMEOUT = 1800.0


def child_argv(raw_argv: list[str], pid_file: str) -> list[str]:
    """``serve``'s own arguments without ``--daemon``, with the pid file named."""
    argv = [a for a in raw_argv if a != "--daemon"]
    return argv if "--pid-file" in argv or any(a.startswith("--pid-file=") for a in argv) \
        else argv + ["--pid-file", pid_file]


def start(raw_argv: list[str], state_dir: str, pid_file: str | None) -> int:
    from ..service.endpoint import of_state_dir
    from ..service.server_process import ServerProcess, ServerStartError

    from ..service import housekeeping
    from ..service.server_process import is_healthy

    state = StateDir(state_dir)
    running = (housekeeping.running_server(state) or {}).get("pid")
    if running or is_healthy(of_state_dir(state.root)):
        error(f"a sandbox server already runs on {state.root}" + (f" (pid {running})" if running else "")
              + f": use it, or end it first with sandbox-kernel stop{_state_option(state)}")
        return 1
    os.makedirs(state.root, mode=0o711, exist_ok=True)
    pid_file = os.path.abspath(pid_file or os.path.join(state.root, PID_FILE_NAME))
    log = os.path.join(state.root, LOG_NAME)
    server = ServerProcess([sys.executable, "-m", "sandbox", *child_argv(raw_argv, pid_file)], log, cwd="/",
                           banner=f"started by sandbox-kernel serve --daemon (pid {os.getpid()})")
    print(f"starting the sandbox server in the background (log: {log}; a first start builds the image)",
          flush=True)
    server.start()
    try:
        # ours, not another that came up meanwhile: server.json names the pid that listens
        server.wait_ready(lambda: is_healthy(of_state_dir(state.root), timeout=1.0)
                          and housekeeping.claimed_pid(state) == server.pid, START_TIMEOUT, interval=0.5,
                          tail_lines=10, name=f"the sandbox server on {state.root}")
    except ServerStartError as exc:
        error(str(exc))
        if server.running:
            server.stop(30)
        return 1
    print(f"sandbox server running (pid {server.pid}) on unix:{state.socket_file}; pid file {pid_file}; "
          f"log {log}; `sandbox-kernel stop{_state_option(state)}` ends it")
    return 0


def _state_option(state: StateDir) -> str:
    return "" if state.root == StateDir.default().root else f" --state-dir {state.root}"
