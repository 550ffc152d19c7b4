"""Finding, and if need be starting, the local sandbox server: the embedded default.

Choosing "Python (sandbox)" in JupyterLab should just work, with no server to start by
hand. So when no URL is configured, the kernel looks for the server of its state directory
on that directory's unix socket (sandbox/endpoint.py), and starts one there if nothing
answers: never another user's or another state directory's server. Several kernels may
start at once (a notebook server restoring its sessions): an flock on
`<state-dir>/server-start.lock` makes one of them start the server while the others wait
for it to answer.

The server is started detached (its own session, output to `<state-dir>/server.log`) so
that it outlives the kernel that started it: the next kernel, and the sandboxes, keep
using it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib
import subprocess
import sys
import time
import typing as t
from urllib.parse import urlsplit

import httpx

from sandbox.config import DEFAULT_PORT
from sandbox.endpoint import Endpoint

LOCK_NAME = "server-start.lock"
LOG_NAME = "server.log"
PID_NAME = "server-start.pid"

StatusCallback = t.Callable[[str], None]

# Started servers, kept referenced so that Popen does not warn about a child still
# running when it is garbage-collected: the child is meant to outlive us.
_started: list[subprocess.Popen] = []


class ServerStartError(RuntimeError):
    """The server could not be started or did not come up; the message says why and
    where its log is."""


def is_healthy(where: Endpoint, timeout: float = 2.0) -> bool:
    try:
        with httpx.Client(transport=where.transport(), timeout=timeout) as client:
            response = client.get(where.base_url + "/v1/health")
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    try:
        return response.json().get("status") == "ok"
    except ValueError:
        return False


def log_tail(path: pathlib.Path, lines: int = 5) -> str:
    """The last lines of a log, for error messages and progress text."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines()[-lines:] if line.strip())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # A zombie (our own exited child not yet reaped) is not a server.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _read_pid(path: pathlib.Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _server_env() -> dict[str, str]:
    """The environment for the server: ours, plus a PYTHONPATH that finds this checkout
    when the project is run from source rather than installed."""
    env = dict(os.environ)
    root = pathlib.Path(__file__).resolve().parents[1]
    if (root / "sandbox").is_dir():
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(root) not in parts:
            env["PYTHONPATH"] = os.pathsep.join([str(root), *parts])
    return env


def start_command(where: Endpoint, state_dir: pathlib.Path) -> list[str]:
    """`serve` for this state directory; on TCP too when the endpoint is a TCP URL."""
    cmd = [sys.executable, "-m", "sandbox", "serve", "--state-dir", str(state_dir)]
    if not where.socket:
        parts = urlsplit(where.url)
        cmd += ["--host", parts.hostname or "127.0.0.1", "--port", str(parts.port or DEFAULT_PORT)]
    return cmd


def ensure_server(
    where: Endpoint,
    state_dir: str | os.PathLike = "",
    *,
    timeout: float = 900.0,
    on_status: StatusCallback | None = None,
) -> bool:
    """Make sure a server answers at `where`, starting one for `state_dir` if none does.
    Blocking. Returns True if this call started the server.

    A server writes its token file before it listens, so one that answers needs no wait
    for it: a 401 after this is final, and reported at once.
    """
    status = on_status or (lambda _msg: None)
    sdir = pathlib.Path(state_dir or _default_state_dir()).expanduser().absolute()
    url = where.describe()
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
            proc: subprocess.Popen | None = None
            if pid is None or not _pid_alive(pid):
                # A previous starter may have died while its server was still building the
                # image; only when that server is gone do we start another.
                status("starting the sandbox server")
                cmd = start_command(where, sdir)
                with open(log_path, "ab") as log:
                    log.write(f"\n--- started by kernel pid {os.getpid()}: {' '.join(cmd)}\n".encode())
                    log.flush()
                    proc = subprocess.Popen(
                        cmd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        close_fds=True,
                        cwd=str(sdir),
                        env=_server_env(),
                    )
                _started.append(proc)
                pid_path.write_text(str(proc.pid))
                pid = proc.pid
                started = True

            began = time.monotonic()
            while not is_healthy(where, timeout=1.0):
                if proc is not None and proc.poll() is not None:
                    raise ServerStartError(
                        f"the sandbox server exited with code {proc.returncode} while starting; "
                        f"last lines of {log_path}:\n{log_tail(log_path)}"
                    )
                if proc is None and pid is not None and not _pid_alive(pid):
                    raise ServerStartError(
                        f"the sandbox server stopped while starting; see {log_path}:\n{log_tail(log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"the sandbox server did not answer at {url} within {timeout:.0f} s; "
                        f"last lines of {log_path}:\n{log_tail(log_path)}"
                    )
                elapsed = time.monotonic() - began
                status(
                    f"starting the sandbox server ({elapsed:.0f} s; the first start builds the sandbox image): {_last_line(log_path)}"
                )
                time.sleep(0.5)
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
    return started


def _last_line(path: pathlib.Path) -> str:
    tail = log_tail(path, 1)
    return tail[-160:] if tail else "no output yet"


def _default_state_dir() -> pathlib.Path:
    from sandbox.paths import default_state_dir

    return pathlib.Path(default_state_dir())
