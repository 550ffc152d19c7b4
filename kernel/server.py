"""Finding, and if need be starting, the local sandbox server: the embedded default.

Choosing "Python (sandbox)" in JupyterLab should just work, with no server to start by
hand. So when no URL is configured, the kernel looks for the server of its state directory
on that directory's unix socket (sandbox/service/endpoint.py), and starts one there if nothing
answers: never another user's or another state directory's server. Several kernels may
start at once (a notebook server restoring its sessions): an flock on
`<state-dir>/server-start.lock` makes one of them start the server while the others wait
for it to answer.

The server is started detached (its own session, output to `<state-dir>/server.log`) so
that it outlives the kernel that started it: the next kernel, and the sandboxes, keep
using it. It stops by itself once no kernel has used it for `server_idle_seconds`
(sandbox/service/idle.py), and `sandbox-kernel lab` stops it when JupyterLab exits.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import time
import typing as t
from urllib.parse import urlsplit

from sandbox.common.processes import pid_alive
from sandbox.core.config import DEFAULT_PORT
from sandbox.service.endpoint import Endpoint
from sandbox.service.server_process import ServerProcess, ServerStartError, is_healthy, log_tail, serve_command, wait_healthy

__all__ = ["ServerStartError", "ensure_server", "is_healthy", "log_tail", "start_command"]

LOCK_NAME = "server-start.lock"
LOG_NAME = "server.log"
PID_NAME = "server-start.pid"

StatusCallback = t.Callable[[str], None]

# Started servers, kept referenced so that Popen does not warn about a child still
# running when it is garbage-collected: the child is meant to outlive us.
_started: list[ServerProcess] = []


def _read_pid(path: pathlib.Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def start_command(where: Endpoint, state_dir: pathlib.Path, idle_seconds: int = 0) -> list[str]:
    """`serve` for this state directory; on TCP too when the endpoint is a TCP URL; stopping
    by itself after ``idle_seconds`` unused (sandbox/service/idle.py)."""
    args: list[str] = ["--set", f"idle_stop_seconds={idle_seconds}"] if idle_seconds else []
    if not where.socket:
        parts = urlsplit(where.url)
        args += ["--host", parts.hostname or "127.0.0.1", "--port", str(parts.port or DEFAULT_PORT)]
    return serve_command(state_dir, *args)


def ensure_server(
    where: Endpoint,
    state_dir: str | os.PathLike = "",
    *,
    timeout: float = 900.0,
    on_status: StatusCallback | None = None,
    idle_seconds: int = 0,
) -> bool:
    """Make sure a server answers at `where`, starting one for `state_dir` if none does.
    Blocking. Returns True if this call started the server.

    A server writes its token file before it listens, so one that answers needs no wait
    for it: a 401 after this is final, and reported at once.
    """
    status = on_status or (lambda _msg: None)
    sdir = pathlib.Path(state_dir or _default_state_dir()).expanduser().absolute()
    if is_healthy(where):
        return False

    # 0711: a root server's sandboxes run as other uids that must traverse it to their
    # image and workspace; the token inside is 0600.
    sdir.mkdir(parents=True, exist_ok=True, mode=0o711)
    deadline = time.monotonic() + timeout
    log_path = sdir / LOG_NAME
    lock_path = sdir / LOCK_NAME
    started = False
    with open(lock_path, "a+") as lock_file:
        # Non-blocking attempts in a loop rather than one blocking flock: a kernel that
        # waits on another's start should notice the server coming up and report progress.
        while True:
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if is_healthy(where, timeout=1.0):
                return False
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"another kernel is starting the sandbox server and it did not come up; see {log_path}"
                )
            status(f"waiting for another kernel to start the sandbox server… ({_last_line(log_path)})")
            time.sleep(0.5)

        try:
            if is_healthy(where, timeout=1.0):
                return False
            pid_path = sdir / PID_NAME
            pid = _read_pid(pid_path)
            server: ServerProcess | None = None
            if pid is None or not pid_alive(pid):
                # A previous starter may have died while its server was still building the
                # image; only when that server is gone do we start another.
                status("starting the sandbox server")
                server = ServerProcess(start_command(where, sdir, idle_seconds), log_path, cwd=sdir,
                                       banner=f"started by kernel pid {os.getpid()}")
                server.start()
                _started.append(server)
                pid_path.write_text(str(server.pid))
                pid = server.pid
                started = True

            def gone() -> str | None:
                if server is not None:
                    return server.exited()
                return None if pid is None or pid_alive(pid) else "stopped"

            def progress(elapsed: float) -> None:
                status(f"starting the sandbox server ({elapsed:.0f} s; the first start builds the sandbox image): "
                       f"{_last_line(log_path)}")

            wait_healthy(where, log_path, max(0.0, deadline - time.monotonic()), gone=gone, on_wait=progress,
                         interval=0.5, tail_lines=5)
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    return started


def _last_line(path: pathlib.Path) -> str:
    tail = log_tail(path, 1)
    return tail[-160:] if tail else "no output yet"


def _default_state_dir() -> pathlib.Path:
    from sandbox.common.paths import default_state_dir

    return pathlib.Path(default_state_dir())
