"""What every test suite needs: real sandbox servers, the host-side view of their sandboxes,
the execute API's events, and kernels running cells.

One module, imported everywhere as ``support`` (tests/conftest.py puts this directory on
sys.path), so that each suite checks its sandboxes the same way and a fix to, say, the
tear-down reaches every suite at once.

Environment:
- SANDBOX_KERNEL_TEST_URL / SANDBOX_KERNEL_TEST_TOKEN: use a server that is already
  running instead of starting one (faster when iterating).
- SANDBOX_KERNEL_TEST_STATE_DIR: where the run's built images are kept between runs, so
  that the default image is built once (tests/testrun.py); default: a directory of the run.
  Every session server (one per xdist worker) has a fresh state directory of its own that
  borrows these images, so runs and workers may share it.
- SANDBOX_KERNEL_TEST_KEEP_STATE=1: keep the session servers' fresh directories.
- SANDBOX_KERNEL_TEST_START_TIMEOUT: seconds a server may take to start (its first start
  builds the default image).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
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

import httpx
import pytest

import testrun

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `kernel.install` and `sandbox.*` from a script run anywhere
    sys.path.insert(0, str(REPO))

from kernel.drive import run_cell as _run_cell  # noqa: E402  (needs REPO on sys.path)
from sandbox.service.server_process import (  # noqa: E402
    ServerProcess,
    ServerStartError,
    is_healthy,
    log_tail,
    serve_command,
    source_env,
)

START_TIMEOUT = float(os.environ.get("SANDBOX_KERNEL_TEST_START_TIMEOUT", "900"))
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_KERNEL_SOCKETS: list[str] = []


def kernel_manager(kernel_name: str, **traits: t.Any) -> t.Any:
    """A jupyter_client KernelManager whose five channels are Unix sockets in a private
    directory of /tmp, not TCP ports.

    With TCP, jupyter_client finds five free ports, closes them and lets the kernel bind
    them later; on a loaded host with many servers on ephemeral ports another process can
    take one in between, and the kernel then dies before its kernel_info reply ("Address
    already in use") or the client talks to a stranger. A socket file in a fresh
    directory cannot be taken. The directory is short (a socket's path has at most 107
    bytes), one per test process, and removed when the process ends.
    """
    from jupyter_client.manager import KernelManager

    if not _KERNEL_SOCKETS:
        folder = tempfile.mkdtemp(prefix="kernels-", dir="/tmp")
        _KERNEL_SOCKETS.append(folder)
        import atexit
        atexit.register(shutil.rmtree, folder, True)
    connection_file = os.path.join(_KERNEL_SOCKETS[0], f"kernel-{secrets.token_hex(4)}.json")
    return KernelManager(kernel_name=kernel_name, transport="ipc", connection_file=connection_file, **traits)


def start_kernel(kernel_name: str, *, cwd: str | os.PathLike, env: dict[str, str], startup_timeout: float = 60,
                 **traits: t.Any) -> tuple[t.Any, t.Any]:
    """jupyter_client's start_new_kernel on a `kernel_manager`: (km, kc), ready."""
    km = kernel_manager(kernel_name, **traits)
    km.start_kernel(cwd=str(cwd), env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=startup_timeout)
    except RuntimeError:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


def jupyter_answers(base: str, token: str) -> bool:
    """A Jupyter server at ``base`` answers its status route (False while it starts)."""
    try:
        return httpx.get(f"{base}/api/status", params={"token": token}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout on PYTHONPATH, for child processes (servers, kernels)."""
    return source_env(env)


def wait_for(predicate: t.Callable[[], t.Any], timeout: float, interval: float = 0.1) -> t.Any:
    """Poll until ``predicate`` returns something true; return its last value, so that the
    caller's own assert says what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def server_env(token: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `sandbox` command: nothing of the developer's own server leaks
    in, and without a token the server makes its own (its state dir's token file)."""
    env = with_repo_on_path(dict(os.environ))
    for key in ("SANDBOX_KERNEL_URL", "SANDBOX_KERNEL_STATE_DIR", "SANDBOX_KERNEL_TOKEN"):
        env.pop(key, None)
    if token is not None:
        env["SANDBOX_KERNEL_TOKEN"] = token
    env.update(extra or {})
    return env


# ------------------------------------------------------------- state dirs and images


def make_state_dir(prefix: str, images_from: pathlib.Path | None = None) -> pathlib.Path:
    """A fresh state directory, borrowing the images already built under ``images_from``.

    Under /tmp and 0711, because a root server's sandboxes run as other uids that must
    traverse every parent to reach their workspace (mkdtemp makes 0700, and TMPDIR may be
    under a 0700 home). Only each image's ``image.json`` is copied: its absolute paths
    (venv, layers, interpreter copy) keep pointing into the source, which outlives these
    servers, so no test pays for an image build nor for copying 300 MiB. The pinned roots
    (``rootfs``, built from an image by its first bwrap or gVisor sandbox) are the source's
    too, through a link: built once per run, not by each server's first sandbox.
    """
    run_tag = testrun.tag()  # the run's tag in the name: its end-of-run check finds what is left
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{prefix}{run_tag}-" if run_tag else prefix, dir="/tmp"))
    path.chmod(0o711)
    try:
        if images_from is not None:
            for info in (images_from / "images").glob("*/image.json"):
                dest = path / "images" / info.parent.name
                dest.mkdir(mode=0o755, parents=True)
                (path / "images").chmod(0o755)  # mkdir's mode is the leaf's: a parent follows the umask
                shutil.copy2(info, dest / "image.json")
            (images_from / "rootfs").mkdir(mode=0o755, exist_ok=True)
            (path / "rootfs").symlink_to(images_from / "rootfs")
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def has_default_image(state_dir: pathlib.Path) -> bool:
    return (state_dir / "images" / "default" / "image.json").is_file()


def build_default_image(state_dir: pathlib.Path) -> None:
    """One build, for when no already built image is at hand (e.g. an external test server)."""
    r = subprocess.run(testrun.image_build_argv(state_dir),
                       cwd=str(REPO), env=server_env(None), capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not has_default_image(state_dir):
        raise RuntimeError(f"building the default image failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


# ------------------------------------------------------------------ host processes


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and
    parentheses); None once the pid is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def proc_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time) of a live, non-zombie process: a pid alone may be reused."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return pid, int(fields[19])


def signal_server(pid: int, signum: int) -> bool:
    """Signal `pid` only while it is still a sandbox server (`serve` in its command line).

    A pid read from `server.json` or a pid file may belong to a server that has already
    stopped, and with this host's 32768 pids it is soon given to another test's process:
    a kernel SIGTERMed so "died before replying to kernel_info" in two CI runs."""
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"serve" not in argv:
        return False
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def pid_alive(pid: int | None) -> bool:
    """Alive and not a zombie (a killed child stays a zombie until its parent reaps it)."""
    return bool(pid) and proc_identity(pid) is not None


def still_running(pid: int, starttime: int) -> bool:
    """The same process is still there, zombie or not: it has not been reaped."""
    fields = _stat(pid)
    return fields is not None and int(fields[19]) == starttime


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [p.decode("utf-8", "replace") for p in f.read().split(b"\0") if p]
    except OSError:
        return []


def command(pid: int) -> str:
    return " ".join(cmdline(pid))


def is_runtime(cmd: str) -> bool:
    """The in-sandbox Python runtime itself (bwrap's own command line names it too)."""
    argv = cmd.split()
    return bool(argv) and argv[0].endswith("/python") and "sandbox_runtime" in argv


def holds_sandbox_code(cmd: str) -> bool:
    """The host process a sandbox's code lives in: the runtime itself (bwrap), or gVisor's
    sandbox process, whose Sentry runs the runtime as a task of its own (gvisor)."""
    argv = cmd.split()
    return is_runtime(cmd) or (bool(argv) and argv[0] == "runsc-sandbox")


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(root: int) -> set[int]:
    """Every process below ``root``: what must end with it."""
    children = _children()
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def process_tree(root: int) -> dict[int, int]:
    """Every host pid and thread id under ``root``, itself included, with its start time:
    the start time tells a survivor from a reused pid."""
    found: dict[int, int] = {}
    for pid in descendants(root) | {root}:
        fields = _stat(pid)
        if fields is None:
            continue
        found[pid] = int(fields[19])
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            task = _stat(int(tid))
            if task is not None:
                found.setdefault(int(tid), int(task[19]))
    return found


def _status_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {name} line for pid {pid}")


def real_uid(pid: int) -> int:
    return int(_status_field(pid, "Uid").split()[0])


def thread_group(pid: int) -> int:
    """The process a thread id belongs to (itself for a process)."""
    return int(_status_field(pid, "Tgid"))


def processes_of(path: pathlib.Path, sandbox_ids: t.Iterable[str] = ()) -> dict[int, str]:
    """Every live process tied to a state (or sandbox) directory: its path on the command
    line (the server, supervisors) or membership of one of these sandboxes' cgroups (bwrap,
    the runtime and whatever user code started, whose command lines name nothing of ours)."""
    needle = str(path)
    groups = [f"/sandbox-kernel/{i}" for i in sandbox_ids]
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        cmd = cmdline(pid)
        hit = any(needle in part for part in cmd) or needle in supervisor_dir_of(pid)
        if not hit and groups:
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    text = f.read()
            except OSError:
                continue
            hit = any(g in text for g in groups)
        if hit and pid_alive(pid):
            found[pid] = " ".join(cmd)[:300]
    return found


def supervisor_dir_of(pid: int) -> str:
    """The sandbox directory a supervisor was given (in its environment), or, for one forked
    by the supervisor template (whose environment block is the template's), the directory
    of the log on its stdout; for the template, the state directory of its log; or ''."""
    try:
        env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return ""
    prefix = b"SANDBOX_SUPERVISOR_DIR="
    named = next((e[len(prefix):].decode() for e in env if e.startswith(prefix)), "")
    if named:
        return named
    try:
        log = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""
    if os.path.basename(log) == "supervisor.log":
        return os.path.dirname(log)
    # the supervisor template itself: its log is the state directory's supervisor-template.log
    from sandbox.common.paths import SUPERVISOR_TEMPLATE_LOG

    return os.path.dirname(log) if os.path.basename(log) == SUPERVISOR_TEMPLATE_LOG else ""


SUPERVISOR_COMMANDS = ("sandbox.supervisor", "sandbox.supervisor.template")  # fresh, and forked by the template


def is_supervisor_command(cmd: list[str]) -> bool:
    return any(name in cmd for name in SUPERVISOR_COMMANDS)


def is_supervisor(pid: int | None, sandbox_dir: pathlib.Path) -> bool:
    """The supervisor of ``sandbox_dir`` (named in its environment or by its log: never its
    argv, which other users read)."""
    cmd = cmdline(pid) if pid else []
    return pid_alive(pid) and is_supervisor_command(cmd) and supervisor_dir_of(pid) == str(sandbox_dir)


def parent_of(pid: int) -> int:
    return int(_status_field(pid, "PPid"))


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_of(int(entry)) == pid:
                    kids.append(int(entry))
            except (OSError, AssertionError):
                continue
    return kids


def template_of(server: "Server") -> int:
    """The server's supervisor template (its child running that module)."""
    found = [pid for pid in children_of(server.proc.pid) if SUPERVISOR_COMMANDS[1] in cmdline(pid)]
    assert len(found) == 1, {p: cmdline(p) for p in children_of(server.proc.pid)}
    return found[0]


def cgroup_dirs(*sandbox_ids: str) -> list[pathlib.Path]:
    """These sandboxes' cgroup directories in every hierarchy (v1: one per controller),
    found by walking the host's tree rather than by asking the service where it put them."""
    wanted = set(sandbox_ids)
    found = []
    for dirpath, dirnames, _ in os.walk(CGROUP_ROOT):
        depth = len(pathlib.Path(dirpath).relative_to(CGROUP_ROOT).parts)
        found += [pathlib.Path(dirpath) / d for d in dirnames if d in wanted]
        dirnames[:] = [d for d in dirnames if not d.startswith("sbx-")] if depth < 5 else []
    return found


def signal_all(pids: t.Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def unmount_under(state_dir: pathlib.Path) -> None:
    """Unmount what ended sandboxes left mounted under ``state_dir`` (a supervisor ended
    by a signal leaves its workspace's loop mount), so that the run gives its loop devices
    back and its state can be removed."""
    prefix = f"{state_dir.resolve()}/"
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def running_in(state_dir: pathlib.Path) -> list[str]:
    """The sandboxes of a state directory that are running, as their supervisors say."""
    return [d.name for d in (state_dir / "sandboxes").glob("*")
            if (d / "state.json").exists() and json.loads((d / "state.json").read_text()).get("state") == "running"]


def sandbox_ids(state_dir: pathlib.Path) -> list[str]:
    try:
        return sorted(os.listdir(state_dir / "sandboxes"))
    except FileNotFoundError:
        return []


def sweep(state_dir: pathlib.Path) -> None:
    """End everything a state directory's servers left behind, as sandboxes outlive their
    server by design: SIGTERM first, which makes a supervisor tear its sandbox down
    cleanly; SIGKILL for the rest; then leftover mounts and cgroups."""
    ids = sandbox_ids(state_dir)
    # Not the whole state dir: other servers' sandboxes name its image on their command lines.
    sandboxes = state_dir / "sandboxes"
    supervisors = [pid for pid in processes_of(sandboxes) if is_supervisor_command(cmdline(pid))]
    signal_all(supervisors, signal.SIGTERM)
    wait_for(lambda: not any(pid_alive(p) for p in supervisors), 15)
    signal_all(processes_of(sandboxes, ids), signal.SIGKILL)
    wait_for(lambda: not processes_of(sandboxes, ids), 10)
    unmount_under(state_dir)
    for d in cgroup_dirs(*ids):
        try:
            os.rmdir(d)
        except OSError:
            pass


# ------------------------------------------------------------------ servers


class Server:
    """``python -m sandbox serve`` on a state directory: start it, kill -9 it, SIGTERM it,
    restart it on the same port and token, and tear down all it left."""

    def __init__(self, state_dir: pathlib.Path, *args: str, token: str | None = None,
                 extra_env: dict[str, str] | None = None, log_name: str = "server.log",
                 start_timeout: float = START_TIMEOUT, keep_state: bool = False, port: int | None = None):
        """``token=None`` lets the server make its own token file (read once it is up)."""
        self.state_dir = state_dir
        self.args = list(args)
        self.token = token
        self._env = server_env(token, extra_env)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = state_dir / log_name
        self.start_timeout = start_timeout
        self.keep_state = keep_state
        self.external = False
        self.process: ServerProcess | None = None

    @classmethod
    def elsewhere(cls, url: str, token: str) -> "Server":
        """A server someone else started: used, emptied of sandboxes at the end, never stopped."""
        server = cls(pathlib.Path(tempfile.gettempdir()), token=token, keep_state=True, port=httpx.URL(url).port)
        server.url = url.rstrip("/")
        server.external = True
        return server

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def env(self) -> dict[str, str]:
        """What a client (a kernel, the CLI) needs to reach this server."""
        env = {"SANDBOX_KERNEL_URL": self.url}
        if self.token is not None:
            env["SANDBOX_KERNEL_TOKEN"] = self.token
        return env

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.process.proc if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def healthy(self) -> bool:
        return is_healthy(self.url)

    def client(self, **kwargs: t.Any) -> httpx.Client:
        kwargs.setdefault("timeout", httpx.Timeout(30, read=120))
        return httpx.Client(base_url=self.url, headers=self.headers, **kwargs)

    def start(self) -> float:
        """Start and wait for /v1/health; returns the seconds that took."""
        assert not self.running, "already running"
        self.process = ServerProcess(serve_command(self.state_dir, "--port", str(self.port), *self.args),
                                     self.log_path, env=self._env, cwd=REPO)
        self.process.start()
        try:
            took = self.process.wait_healthy(self.url, self.start_timeout, interval=0.05)
        except ServerStartError:
            self.terminate()
            raise
        if self.token is None:
            self.token = (self.state_dir / "token").read_text().strip()
        return took

    def open(self) -> "Server":
        """Start; a failed start leaves nothing behind, as no caller holds a server to close."""
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "Server":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kill9(self) -> None:
        """A crash: the server process alone, its sandboxes' supervisors live on."""
        assert self.running
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def sigterm(self) -> None:
        """An orderly stop, left to the test to wait for."""
        assert self.running
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def terminate(self) -> None:
        """Stop the server, SIGKILL if it hangs; its sandboxes live on (supervisors are
        sessions of their own, out of the server's process group)."""
        if self.process is not None:
            self.process.stop()

    def delete_sandboxes(self) -> None:
        try:
            with self.client(timeout=30) as c:
                for sbx in c.get("/v1/sandboxes").json().get("sandboxes", []):
                    c.delete(f"/v1/sandboxes/{sbx['id']}")
        except (httpx.HTTPError, ValueError):
            pass

    def close(self) -> None:
        """Delete the sandboxes it lists, stop it, end what is left, remove its state."""
        if self.running or self.external:
            self.delete_sandboxes()
        self.terminate()
        if not self.external:
            sweep(self.state_dir)
        if not self.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return log_tail(self.log_path, n)


# A server on a borrowed image starts in about a second: one that takes minutes is broken.
OWN_SERVER_START_TIMEOUT = 120.0


def tier_args(isolation: str) -> list[str]:
    """`serve` arguments that make ``isolation`` the server's default tier."""
    return ["--set", f"default_isolation={isolation}"]


def own_server(image_source: pathlib.Path, *args: str, extra_env: dict[str, str] | None = None) -> Server:
    """A server of a test's own (to kill, to stop, to configure with weaker isolation), not
    yet started, on a fresh state directory that borrows ``image_source``'s built images.
    No warm pool unless ``args`` asks for one; ``close()`` removes all it left."""
    state = make_state_dir("sk-own-", images_from=image_source)
    return Server(state, "--pool-size", "0", "--log-level", "info", *args, token=secrets.token_hex(16),
                  extra_env=extra_env, start_timeout=OWN_SERVER_START_TIMEOUT)


def start_session_server() -> Server:
    """The server every suite shares; see the module docstring for the environment."""
    url = os.environ.get("SANDBOX_KERNEL_TEST_URL")
    if url:
        if not is_healthy(url):
            raise RuntimeError(f"SANDBOX_KERNEL_TEST_URL={url} does not answer /v1/health")
        return Server.elsewhere(url, os.environ.get("SANDBOX_KERNEL_TEST_TOKEN", ""))
    home = testrun.image_home()
    testrun.ensure_default_image(home, server_env(None), REPO)
    state_dir = make_state_dir("sbk-test-state-", images_from=home)
    keep = os.environ.get("SANDBOX_KERNEL_TEST_KEEP_STATE") == "1"
    # A warm pool, as the product's default, without the preload: the suite claims hundreds of
    # its sandboxes and no test needs their imports ahead (docs/testing.md).
    return Server(state_dir, "--set", "pool_preload=false", token=secrets.token_hex(16), log_name="test-server.log",
                  keep_state=keep).open()


# --------------------------------------------------------------------- notebooks under nbval


def summary_counts(output: str) -> dict[str, int]:
    """pytest's last line, e.g. '3 failed, 14 passed, 2 warnings in 20.1s' -> {'failed': 3,
    'passed': 14} (warnings are not an outcome)."""
    last = [line for line in output.splitlines() if line.strip()][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last) if word not in ("warning", "warnings")}


def code_cell_count(path: pathlib.Path) -> int:
    """The code cells of a notebook: nbval runs one test per code cell."""
    import nbformat  # only where notebooks are read

    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


# --------------------------------------------------------------------- sandboxes


def sandbox_dir(server: Server, sandbox_id: str) -> pathlib.Path:
    """Where a sandbox's host-side state is; a test that needs it cannot run against a
    server started elsewhere."""
    path = server.state_dir / "sandboxes" / sandbox_id
    if server.external:
        pytest.skip(f"the server's state directory is not on this host ({path}): "
                    "SANDBOX_KERNEL_TEST_URL points at a server started elsewhere")
    return path


def read_state(server: Server, sandbox_id: str) -> dict:
    return json.loads((sandbox_dir(server, sandbox_id) / "state.json").read_text())


def supervisor_pid(server: Server, sandbox_id: str) -> int:
    state = read_state(server, sandbox_id)
    pid = state["supervisor_pid"]
    assert isinstance(pid, int) and pid > 1, state
    return pid


def create(client: httpx.Client, **fields) -> dict:
    r = client.post("/v1/sandboxes", json=fields)
    assert r.status_code == 201, r.text
    return r.json()


def stream_events(client: httpx.Client, method: str, path: str, **kwargs: t.Any) -> list[dict]:
    """The NDJSON events of a streamed answer, read to its end."""
    with client.stream(method, path, **kwargs) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def execute(client: httpx.Client, sandbox_id: str, code: str, **fields) -> list[dict]:
    """Run code; return its events, ``done`` last."""
    return stream_events(client, "POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields})


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def done_of(events: list[dict]) -> dict:
    assert events, "the execute answered no event at all"
    assert events[-1]["type"] == "done", events
    assert len(of_type(events, "done")) == 1, events
    return events[-1]


def ok(events: list[dict]) -> list[dict]:
    """The events of a cell that must have succeeded (the failure message shows them)."""
    done = done_of(events)
    assert done["status"] == "ok", events
    assert not of_type(events, "error"), events
    return events


def stream_text(events: list[dict], name: str = "stdout") -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == name)


def result_text(events: list[dict]) -> str | None:
    results = of_type(events, "execute_result")
    return results[-1]["data"].get("text/plain") if results else None


# ------------------------------------------------------------------ kernels


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


def end_fork_servers() -> None:
    """End the kernel fork servers this process started (kernel/forkserver.py, one per
    interpreter and environment). Each ends by itself within a second of its parent, when
    it has no kernel left; the run's check for what it left behind may look first."""
    for pid in _children().get(os.getpid(), []):
        if "kernel.forkserver" in command(pid):
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def remove_kernelspec() -> None:
    global _KERNELSPEC_PREFIX
    if _KERNELSPEC_PREFIX is not None:
        shutil.rmtree(_KERNELSPEC_PREFIX, ignore_errors=True)
        _KERNELSPEC_PREFIX = None


def kernel_environ(server: Server, jupyter_data: pathlib.Path) -> dict[str, str]:
    """The environment variables a test kernel needs: this server, no embedded start."""
    env = with_repo_on_path(dict(os.environ))
    env.update(server.env)
    env["SANDBOX_KERNEL_START_SERVER"] = "0"
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(jupyter_data), *[p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]]
    )
    return env


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
    def notes(self) -> str:
        """The text of the kernel's notes in this cell (kernel/notes.py: display_data, not stderr)."""
        from kernel.notes import is_note

        return "".join(m["content"]["data"]["text/plain"] for m in self.of_type("display_data") if is_note(m["content"]))

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
    reply, outputs = _run_cell(kc, code, timeout, **kwargs)
    return CellRun(reply, outputs)


def shell_request(kc: t.Any, method: str, *args: t.Any, timeout: float = 30, **kwargs: t.Any) -> dict[str, t.Any]:
    msg_id = getattr(kc, method)(*args, **kwargs)
    while True:
        msg = kc.get_shell_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def disk_used(path: str | os.PathLike) -> int:
    """Bytes in use on the filesystem holding ``path``, once written out: how much a copy
    or a clone really took (a reflink adds almost nothing)."""
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@contextlib.contextmanager
def fresh_account(prefix: str, *, why_root: str, home: bool = False) -> t.Iterator[str]:
    """A new ordinary Unix account (``useradd``), removed afterwards: a real other uid for
    a test to act as. Skipped with ``why_root`` where this process is not root, and where
    the account tools are missing."""
    if os.geteuid() != 0:
        pytest.skip(why_root)
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: no ordinary account to act as")
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", *(["--create-home"] if home else []), "--shell", "/bin/sh", name],
                   check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", *(["--remove"] if home else []), name], capture_output=True)
