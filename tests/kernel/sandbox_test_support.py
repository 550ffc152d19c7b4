"""Shared test machinery: one real sandbox server per test session, the kernelspec
installed where jupyter_client finds it, and helpers to run cells.

Imported by tests/kernel/conftest.py and tests/client/conftest.py under this one module
name, so that both directories share one server (the first start builds the sandbox
image: minutes, not to be paid twice).

Environment:
- SANDBOX_KERNEL_TEST_URL / SANDBOX_KERNEL_TEST_TOKEN: use a server that is already
  running instead of starting one (faster when iterating).
- SANDBOX_KERNEL_TEST_STATE_DIR: state directory for the started server (kept between
  runs, so its image is built once); default: a fresh temporary directory.
"""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing as t
from dataclasses import dataclass
from queue import Empty

import httpx

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
SERVER_START_TIMEOUT = float(os.environ.get("SANDBOX_KERNEL_TEST_START_TIMEOUT", "900"))


@dataclass
class TestServer:
    url: str
    token: str
    state_dir: pathlib.Path
    proc: subprocess.Popen | None = None
    log_path: pathlib.Path | None = None
    owns_state_dir: bool = False

    @property
    def env(self) -> dict[str, str]:
        return {"SANDBOX_KERNEL_URL": self.url, "SANDBOX_KERNEL_TOKEN": self.token}

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def make_state_dir(prefix: str = "sbk-test-state-") -> pathlib.Path:
    """A fresh state directory that a root server's sandbox uids can traverse (mkdtemp
    and pytest's tmp_path are 0700 all the way down)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        r = httpx.get(url + "/v1/health", timeout=2.0)
        return r.status_code == 200 and r.json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`python -m sandbox` and `python -m kernel` must import this checkout from any cwd."""
    env = dict(env)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in parts:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *parts])
    return env


_SERVER: TestServer | None = None


def get_server() -> TestServer:
    """The session's server, started on first use."""
    global _SERVER
    if _SERVER is not None:
        return _SERVER
    url = os.environ.get("SANDBOX_KERNEL_TEST_URL")
    if url:
        token = os.environ.get("SANDBOX_KERNEL_TEST_TOKEN", "")
        if not healthy(url):
            raise RuntimeError(f"SANDBOX_KERNEL_TEST_URL={url} does not answer /v1/health")
        _SERVER = TestServer(url.rstrip("/"), token, pathlib.Path(tempfile.gettempdir()))
        return _SERVER

    state = os.environ.get("SANDBOX_KERNEL_TEST_STATE_DIR")
    state_dir = pathlib.Path(state) if state else make_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    # mkdtemp makes it 0700; a root server's sandboxes run as other uids that must
    # traverse it to reach their image and workspace.
    state_dir.chmod(0o711)
    port = free_port()
    server = TestServer(
        f"http://127.0.0.1:{port}",
        secrets.token_hex(16),
        state_dir,
        log_path=state_dir / "test-server.log",
        owns_state_dir=not state,
    )
    try:
        spawn_server(server)
    except RuntimeError:
        if server.proc is not None and server.proc.poll() is None:
            stop_server(server)
        raise
    _SERVER = server
    return server


def spawn_server(server: TestServer) -> None:
    """Start `sandbox serve` for `server` (again, after `stop_process`) and wait for health."""
    env = with_repo_on_path(dict(os.environ))
    env["SANDBOX_KERNEL_TOKEN"] = server.token
    env.pop("SANDBOX_KERNEL_URL", None)
    port = str(httpx.URL(server.url).port)
    assert server.log_path is not None
    with open(server.log_path, "ab") as log:
        server.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "serve", "--port", port, "--state-dir", str(server.state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while not healthy(server.url):
        if server.proc.poll() is not None:
            raise RuntimeError(f"the sandbox server exited with {server.proc.returncode}:\n{server.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the sandbox server did not answer within {SERVER_START_TIMEOUT} s:\n{server.log_tail()}"
            )
        time.sleep(0.2)


def stop_process(server: TestServer) -> None:
    """Stop the server process only; its sandboxes live on (their supervisors are detached)."""
    if server.proc is None or server.proc.poll() is not None:
        return
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)


def supervisor_pids(state_dir: pathlib.Path) -> list[int]:
    """Supervisors of the sandboxes under `state_dir`, found by their command line (each
    names its sandbox directory), so that only this server's are touched."""
    marker = f"{state_dir.resolve()}/sandboxes/"
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in args]
        if "sandbox.supervisor" in text and any(a.startswith(marker) for a in text):
            pids.append(int(entry.name))
    return pids


def end_supervisors(state_dir: pathlib.Path, timeout: float = 15.0) -> None:
    """End the sandboxes the API does not list (the warm pool's), which would otherwise
    outlive the server by design: SIGTERM tells a supervisor to end its sandbox."""
    pids = supervisor_pids(state_dir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pathlib.Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def unmount_leftovers(state_dir: pathlib.Path) -> None:
    """Unmount workspace filesystems that ended sandboxes left mounted under `state_dir`
    (a supervisor ended by SIGTERM leaves its loop mount: reported to the service's
    owner), so that the test run gives back its loop devices and can remove its state."""
    prefix = f"{state_dir.resolve()}/"
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", point], check=False, capture_output=True)


def stop_server(server: TestServer | None = None) -> None:
    """Delete every sandbox (they outlive the server by design), then stop the server."""
    global _SERVER
    server = server or _SERVER
    if server is None:
        return
    headers = {"Authorization": f"Bearer {server.token}"}
    try:
        listing = httpx.get(server.url + "/v1/sandboxes", headers=headers, timeout=10).json()
        for sbx in listing.get("sandboxes", []):
            httpx.delete(f"{server.url}/v1/sandboxes/{sbx['id']}", headers=headers, timeout=30)
    except (httpx.HTTPError, ValueError):
        pass
    stop_process(server)
    if server.proc is not None:
        end_supervisors(server.state_dir)
        unmount_leftovers(server.state_dir)
    if server.owns_state_dir and os.environ.get("SANDBOX_KERNEL_TEST_KEEP_STATE") != "1":
        shutil.rmtree(server.state_dir, ignore_errors=True)
    if server is _SERVER:
        _SERVER = None


_KERNELSPEC_PREFIX: pathlib.Path | None = None


def install_kernelspec() -> pathlib.Path:
    """Install the kernelspec into a temporary prefix; returns its share/jupyter dir."""
    global _KERNELSPEC_PREFIX
    if _KERNELSPEC_PREFIX is None:
        from kernel.install import install_kernelspec as install

        prefix = pathlib.Path(tempfile.mkdtemp(prefix="sbk-test-jupyter-"))
        install(prefix=str(prefix))
        _KERNELSPEC_PREFIX = prefix
    return _KERNELSPEC_PREFIX / "share" / "jupyter"


def remove_kernelspec() -> None:
    global _KERNELSPEC_PREFIX
    if _KERNELSPEC_PREFIX is not None:
        shutil.rmtree(_KERNELSPEC_PREFIX, ignore_errors=True)
        _KERNELSPEC_PREFIX = None


def kernel_environ(server: TestServer, jupyter_data: pathlib.Path) -> dict[str, str]:
    """The environment variables a test kernel needs: this server, no embedded start."""
    env = with_repo_on_path(dict(os.environ))
    env.update(server.env)
    env["SANDBOX_KERNEL_START_SERVER"] = "0"
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(jupyter_data), *[p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]]
    )
    return env


# --------------------------------------------------------------------------- cells


@dataclass
class CellRun:
    reply: dict[str, t.Any]
    outputs: list[dict[str, t.Any]]

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def of_type(self, msg_type: str) -> list[dict[str, t.Any]]:
        return [m for m in self.outputs if m["msg_type"] == msg_type]

    def stream(self, name: str) -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == name)

    @property
    def stdout(self) -> str:
        return self.stream("stdout")

    @property
    def stderr(self) -> str:
        return self.stream("stderr")

    @property
    def errors(self) -> list[dict[str, t.Any]]:
        return [m["content"] for m in self.of_type("error")]

    def visible(self) -> list[dict[str, t.Any]]:
        """The outputs a notebook keeps, as a frontend applies clear_output."""
        kept: list[dict[str, t.Any]] = []
        pending_clear = False
        for msg in self.outputs:
            if msg["msg_type"] == "clear_output":
                if msg["content"].get("wait"):
                    pending_clear = True
                else:
                    kept = []
                continue
            if pending_clear:
                kept, pending_clear = [], False
            if msg["msg_type"] != "update_display_data":
                kept.append(msg)
        return kept

    def result_text(self) -> str | None:
        results = self.of_type("execute_result")
        return results[-1]["content"]["data"].get("text/plain") if results else None


def run_cell(kc: t.Any, code: str, timeout: float = 60, **kwargs: t.Any) -> CellRun:
    """Execute `code` and collect every IOPub message of that request up to idle.

    A test that goes on after a failing cell should run that cell with
    stop_on_error=False: otherwise ipykernel aborts requests that arrive while it is still
    aborting the queue, and the next cell can come back "aborted" (a race in ipykernel,
    not in this kernel).
    """
    msg_id = kc.execute(code, **kwargs)
    deadline = time.monotonic() + timeout
    reply = None
    while reply is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no execute_reply within {timeout} s for {code!r}")
        try:
            msg = kc.get_shell_msg(timeout=remaining)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg
    outputs = []
    while True:
        remaining = deadline - time.monotonic()
        try:
            msg = kc.get_iopub_msg(timeout=max(remaining, 5))
        except Empty:
            raise TimeoutError(f"no idle status for {code!r}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                break
            continue
        if msg["msg_type"] == "execute_input":
            continue
        outputs.append(msg)
    return CellRun(reply, outputs)


def shell_request(kc: t.Any, method: str, *args: t.Any, timeout: float = 30, **kwargs: t.Any) -> dict[str, t.Any]:
    msg_id = getattr(kc, method)(*args, **kwargs)
    while True:
        msg = kc.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]
