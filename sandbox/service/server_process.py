"""`python -m sandbox serve` as a child process: start it, wait until `/v1/health` answers,
stop its process group, show the end of its log.

Every launcher does these four things the same way, so they are written once here: the
kernel's embedded default (kernel/server.py), the test suites (tests/support.py) and the
benchmarks (bench/harness.py). What differs between them (which arguments, whether the
child outlives its parent, what to say while waiting) stays with the caller.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import typing as t

import httpx

from .endpoint import Endpoint

# The checkout this module runs from, when it runs from source rather than installed.
SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2]


class ServerStartError(RuntimeError):
    """The server could not be started or did not come up; the message says why and
    ends with the last lines of its log."""


def source_env(env: t.Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: ours) plus a PYTHONPATH that finds this checkout, so that a child
    `python -m sandbox` (or `-m kernel`) runs this code when the project is not installed."""
    env = dict(os.environ if env is None else env)
    if (SOURCE_ROOT / "sandbox").is_dir():
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(SOURCE_ROOT) not in parts:
            env["PYTHONPATH"] = os.pathsep.join([str(SOURCE_ROOT), *parts])
    return env


def serve_command(state_dir: str | os.PathLike, *args: str) -> list[str]:
    """`serve` for a state directory, with this interpreter."""
    return [sys.executable, "-m", "sandbox", "serve", "--state-dir", str(state_dir), *args]


def is_healthy(where: Endpoint | str, timeout: float = 2.0) -> bool:
    """True if a sandbox server answers `/v1/health` with status ok at `where` (an
    endpoint, or an http URL)."""
    if isinstance(where, str):
        where = Endpoint(where.rstrip("/"))
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


def log_tail(path: str | os.PathLike, lines: int = 5) -> str:
    """The last non-blank lines of a log, for error messages and progress text."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def wait_ready(
    ready: t.Callable[[], bool],
    log_path: str | os.PathLike,
    timeout: float,
    *,
    gone: t.Callable[[], str | None],
    on_wait: t.Callable[[float], None] | None = None,
    interval: float = 0.2,
    tail_lines: int = 30,
    name: str = "the sandbox server",
) -> float:
    """Wait until `ready()`; returns the seconds that took.

    `gone()` says why the process can no longer become ready (it exited), or None while it
    still may. Raises ServerStartError, with the log's tail, when it is gone or when
    `timeout` passes. `on_wait(elapsed)` is called between polls (progress text).
    """
    began = time.monotonic()
    while not ready():
        why = gone()
        if why is not None:
            raise ServerStartError(
                f"{name} {why} while starting; last lines of {log_path}:\n{log_tail(log_path, tail_lines)}"
            )
        elapsed = time.monotonic() - began
        if elapsed > timeout:
            raise ServerStartError(
                f"{name} did not answer within {timeout:.0f} s; last lines of {log_path}:\n"
                f"{log_tail(log_path, tail_lines)}"
            )
        if on_wait is not None:
            on_wait(elapsed)
        time.sleep(interval)
    return time.monotonic() - began


def wait_healthy(where: Endpoint | str, log_path: str | os.PathLike, timeout: float, **kwargs: t.Any) -> float:
    """`wait_ready` for a sandbox server (or gateway) answering `/v1/health` at `where`."""
    url = where if isinstance(where, str) else where.describe()
    kwargs.setdefault("name", f"the sandbox server at {url}")
    return wait_ready(lambda: is_healthy(where, timeout=1.0), log_path, timeout, **kwargs)


class ServerProcess:
    """One `sandbox serve` child in a session (and process group) of its own, its output
    appended to `log_path`. Being its own session, it outlives a parent that does not stop
    it (the kernel's embedded server relies on that); its sandboxes' supervisors are
    sessions of their own too, so stopping the group stops the server alone."""

    def __init__(
        self,
        command: t.Sequence[str],
        log_path: str | os.PathLike,
        *,
        env: t.Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        banner: str | None = None,
    ) -> None:
        self.command = list(command)
        self.log_path = pathlib.Path(log_path)
        self.env = dict(env) if env is not None else source_env()
        self.cwd = str(cwd) if cwd is not None else None
        self.banner = banner
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            if self.banner:
                log.write(f"\n--- {self.banner}: {' '.join(self.command)}\n".encode())
                log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                cwd=self.cwd,
                env=self.env,
            )
        return self.proc

    def exited(self) -> str | None:
        """Why it can no longer answer (for `wait_healthy`), or None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"exited with code {self.proc.returncode}"

    def wait_healthy(self, where: Endpoint | str, timeout: float, **kwargs: t.Any) -> float:
        """Wait for `/v1/health` at `where` (see `wait_healthy`); ServerStartError if it
        exits first or does not answer in time."""
        return wait_healthy(where, self.log_path, timeout, gone=self.exited, **kwargs)

    def wait_ready(self, ready: t.Callable[[], bool], timeout: float, **kwargs: t.Any) -> float:
        """Wait for `ready()` (see `wait_ready`), for a child that is not a sandbox server."""
        return wait_ready(ready, self.log_path, timeout, gone=self.exited, **kwargs)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to its process group, SIGKILL if it has not exited within `timeout`.
        Returns its exit code, or None if it had to be killed (or never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self.proc.returncode
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            return self.proc.wait(timeout)
        except ProcessLookupError:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            return None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)
