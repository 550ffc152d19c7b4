"""Servers that the reliability tests own, so that they can kill -9, SIGTERM and restart them.

Each server gets a fresh state directory under /tmp (0711, so that sandbox uids can
traverse it) whose ``images/`` holds only copies of an already built image's
``image.json``: its absolute paths (venv, layers, python copy, matplotlib cache) keep
pointing into the source directory, which outlives these servers, so no test pays for an
image build, nor for copying or deleting 300 MiB of files (a hard-linked ``cp -al`` of the
tree also works, at about 2 s to make and 2 s to remove).

Sandboxes outlive their server by design, so tear-down is explicit: delete what a live
server still lists, stop the server, then end every supervisor recorded in the state
directory (SIGTERM first, which makes a supervisor tear its sandbox down cleanly; SIGKILL
for the rest), unmount leftover workspace filesystems and remove leftover cgroups.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import typing as t

import httpx

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_default_image(state_dir: pathlib.Path) -> bool:
    return (state_dir / "images" / "default" / "image.json").is_file()


def make_state_dir(images_from: pathlib.Path | None, prefix: str = "sk-rel-") -> pathlib.Path:
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o711)
    try:
        if images_from is not None:
            for info in (images_from / "images").glob("*/image.json"):
                dest = path / "images" / info.parent.name
                dest.mkdir(mode=0o755, parents=True)
                shutil.copy2(info, dest / "image.json")
            (path / "images").chmod(0o755)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def build_default_image(state_dir: pathlib.Path) -> None:
    """One build, for when no already built image is at hand (e.g. an external test server)."""
    r = subprocess.run([sys.executable, "-m", "sandbox", "image", "build", "--state-dir", str(state_dir)],
                       cwd=str(REPO), env=_env(None), capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not has_default_image(state_dir):
        raise RuntimeError(f"building the default image failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def _env(token: str | None) -> dict[str, str]:
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in parts:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *parts])
    env.pop("SANDBOX_KERNEL_URL", None)
    env.pop("SANDBOX_KERNEL_STATE_DIR", None)
    if token is None:
        env.pop("SANDBOX_KERNEL_TOKEN", None)
    else:
        env["SANDBOX_KERNEL_TOKEN"] = token
    return env


# ------------------------------------------------------------------ processes


def cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [p for p in f.read().split(b"\0") if p]
    except OSError:
        return []


def pid_alive(pid: int | None) -> bool:
    """Alive and not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def is_supervisor(pid: int | None, sandbox_dir: pathlib.Path) -> bool:
    cmd = cmdline(pid) if pid else []
    return pid_alive(pid) and b"sandbox.supervisor" in cmd and str(sandbox_dir).encode() in cmd


def wait_for(predicate: t.Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def processes_of(state_dir: pathlib.Path, sandbox_ids: t.Iterable[str] = ()) -> dict[int, str]:
    """Every live process tied to this state directory: its path on the command line (server,
    supervisors, bwrap) or membership of one of these sandboxes' cgroups (the runtime and
    whatever user code started, whose command lines name nothing of ours)."""
    needle = str(state_dir).encode()
    groups = [f"/sandbox-kernel/{i}" for i in sandbox_ids]
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        cmd = cmdline(pid)
        hit = any(needle in part for part in cmd)
        if not hit and groups:
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    text = f.read()
            except OSError:
                continue
            hit = any(g in text for g in groups)
        if hit and pid_alive(pid):
            found[pid] = b" ".join(cmd).decode(errors="replace")[:300]
    return found


def is_runtime(cmd: str) -> bool:
    """The in-sandbox Python runtime itself (bwrap's own command line may name it too)."""
    argv = cmd.split()
    return bool(argv) and argv[0].endswith("/python") and "sandbox_runtime" in argv


def sandbox_ids(state_dir: pathlib.Path) -> list[str]:
    try:
        return sorted(os.listdir(state_dir / "sandboxes"))
    except FileNotFoundError:
        return []


def read_state(state_dir: pathlib.Path, sandbox_id: str) -> dict:
    with open(state_dir / "sandboxes" / sandbox_id / "state.json") as f:
        return json.load(f)


def supervisor_pid(state_dir: pathlib.Path, sandbox_id: str) -> int:
    return int(read_state(state_dir, sandbox_id)["supervisor_pid"])


def cgroup_dirs(sandbox_id: str) -> list[str]:
    from sandbox.isolation import cgroups

    support = cgroups.detect()
    return sorted(set(cgroups.SandboxCgroup(support, sandbox_id).dirs.values())) if support.version else []


def sweep(state_dir: pathlib.Path) -> None:
    """End everything a state directory's servers left behind (see the module docstring)."""
    ids = sandbox_ids(state_dir)
    pids = []
    for sandbox_id in ids:
        try:
            pid = supervisor_pid(state_dir, sandbox_id)
        except (OSError, ValueError, KeyError):
            continue
        if is_supervisor(pid, state_dir / "sandboxes" / sandbox_id):
            pids.append(pid)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    wait_for(lambda: not any(pid_alive(p) for p in pids), 15)
    for pid in list(processes_of(state_dir, ids)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not processes_of(state_dir, ids), 10)
    for sandbox_id in ids:
        workspace = state_dir / "sandboxes" / sandbox_id / "workspace"
        if os.path.ismount(workspace):
            subprocess.run(["umount", "-l", str(workspace)], capture_output=True)
        for d in cgroup_dirs(sandbox_id):
            try:
                os.rmdir(d)
            except OSError:
                pass


# ------------------------------------------------------------------ the server


class Server:
    """``python -m sandbox serve`` on a state directory; start, kill -9, SIGTERM, restart."""

    def __init__(self, state_dir: pathlib.Path, *args: str, token: str | None = None):
        self.state_dir = state_dir
        self.args = list(args)
        self.token = token or secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = state_dir / "server.log"
        self.headers = {"Authorization": f"Bearer {self.token}"}

    def start(self) -> float:
        """Start and wait for /v1/health; returns the seconds that took."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.log_path, "ab")
        began = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "serve", "--port", str(self.port), "--state-dir", str(self.state_dir),
             "--pool-size", "0", "--log-level", "info", *self.args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=_env(self.token),
            cwd=str(REPO), start_new_session=True,
        )
        log.close()
        deadline = began + START_TIMEOUT
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer within {START_TIMEOUT} s:\n{self.log_tail()}")
            time.sleep(0.05)
        return time.monotonic() - began

    def healthy(self) -> bool:
        try:
            r = httpx.get(self.url + "/v1/health", timeout=2.0)
            return r.status_code == 200 and r.json().get("status") == "ok"
        except (httpx.HTTPError, ValueError):
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.running
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def sigterm(self) -> None:
        assert self.running
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def client(self, **kwargs) -> httpx.Client:
        kwargs.setdefault("timeout", httpx.Timeout(30, read=120))
        return httpx.Client(base_url=self.url, headers=self.headers, **kwargs)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Delete what the server lists, then SIGTERM it (SIGKILL if it hangs)."""
        if self.running:
            try:
                with self.client(timeout=30) as c:
                    for sbx in c.get("/v1/sandboxes").json().get("sandboxes", []):
                        c.delete(f"/v1/sandboxes/{sbx['id']}")
            except (httpx.HTTPError, ValueError):
                pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# ------------------------------------------------------------------ API helpers


def execute(client: httpx.Client, sandbox_id: str, code: str, **fields) -> list[dict]:
    events = []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                events.append(json.loads(line))
    return events


def done_of(events: list[dict]) -> dict:
    assert events and events[-1]["type"] == "done", events
    assert sum(e["type"] == "done" for e in events) == 1, events
    return events[-1]


def errors_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "error"]


def stdout_of(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def result_of(events: list[dict]) -> str | None:
    results = [e for e in events if e["type"] == "execute_result"]
    return results[-1]["data"].get("text/plain") if results else None


def ok(events: list[dict]) -> list[dict]:
    done = done_of(events)
    assert done["status"] == "ok" and not errors_of(events), events
    return events


def create(client: httpx.Client, **fields) -> dict:
    r = client.post("/v1/sandboxes", json=fields)
    assert r.status_code == 201, r.text
    return r.json()


def long_cell(seconds: int) -> str:
    """A cell that says when it has really started (the runtime runs it), then sleeps."""
    return f"import time\nstarted = True\nprint('started', flush=True)\ntime.sleep({seconds})\nfinished = True"


def stream_in_thread(server: Server, sandbox_id: str, code: str) -> tuple[threading.Thread, dict]:
    """Execute in a thread. The dict gets the events, ``started`` (an Event set once the cell
    printed 'started': an interrupt sent before that can race the cell's start), when the
    stream ended and any exception (a torn stream)."""
    out: dict = {"events": [], "error": None, "ended": None, "status": None, "started": threading.Event()}

    def go() -> None:
        try:
            with server.client(timeout=httpx.Timeout(10, read=60)) as c:
                with c.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code}) as r:
                    out["status"] = r.status_code
                    for line in r.iter_lines():
                        if line:
                            event = json.loads(line)
                            out["events"].append(event)
                            if event["type"] == "stream" and "started" in event.get("text", ""):
                                out["started"].set()
        except Exception as exc:
            out["error"] = exc
        out["ended"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out
