"""What every benchmark needs: its own server, statistics, samplers of memory and load.

The numbers are only worth comparing if a figure and its baseline see the same machine,
so the helpers here make interleaving easy and record how busy the host was meanwhile
(other engineers' test suites share these two cores).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
import typing as t

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `sandbox.*` when a benchmark runs as a script
    sys.path.insert(0, str(REPO))

from sandbox.service.server_process import (  # noqa: E402
    ServerProcess,
    ServerStartError,
    log_tail,
    serve_command,
    source_env,
)

DEFAULT_STATE_DIR = "/tmp/sk-bench-state"
DATA_DIR = pathlib.Path("/tmp/sk-bench-data")
MiB = 1024 * 1024


# --------------------------------------------------------------------- statistics


def percentile(values: t.Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: t.Sequence[float], scale: float = 1.0) -> dict[str, t.Any]:
    """n, p50, p95, p99, mean, min, max of `values` multiplied by `scale` (e.g. 1000 for ms)."""
    if not values:
        return {"n": 0}
    xs = [v * scale for v in values]
    return {
        "n": len(xs),
        "p50": percentile(xs, 50),
        "p95": percentile(xs, 95),
        "p99": percentile(xs, 99),
        "mean": sum(xs) / len(xs),
        "min": min(xs),
        "max": max(xs),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# --------------------------------------------------------------------- host state


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return total - idle, total


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process (not its children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on CPU, seconds runnable but waiting for a CPU) over all threads of `pid`."""
    run = wait = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                a, b, _ = f.read().split()
            run += int(a)
            wait += int(b)
        except (OSError, ValueError):
            continue
    return run / 1e9, wait / 1e9


def foreign_test_processes() -> dict[str, int]:
    """How many other engineers' pytest/bench processes run now (the load we do not control)."""
    me = os.getpid()
    counts: dict[str, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for key in ("pytest", "chromium", "pip install"):
            if key in cmd:
                counts[key] = counts.get(key, 0) + 1
    return counts


class HostLoad:
    """Host CPU busy fraction and load average over one benchmark."""

    def __init__(self) -> None:
        self.start_load = loadavg()
        self.start_cpu = cpu_times()
        self.start_foreign = foreign_test_processes()
        self.t0 = time.monotonic()

    def finish(self) -> dict[str, t.Any]:
        busy0, total0 = self.start_cpu
        busy1, total1 = cpu_times()
        return {
            "seconds": round(time.monotonic() - self.t0, 2),
            "loadavg_start": self.start_load,
            "loadavg_end": loadavg(),
            "host_cpu_busy": round((busy1 - busy0) / max(1, total1 - total0), 3),
            "foreign_processes_start": self.start_foreign,
            "foreign_processes_end": foreign_test_processes(),
        }


def vm_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def smaps_rollup(pid: int) -> dict[str, int]:
    """Rss and Pss (bytes) of one process; {} when it is gone or unreadable."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] in ("Rss:", "Pss:", "Private_Dirty:", "Private_Clean:"):
                    out[parts[0][:-1].lower()] = int(parts[1]) * 1024
    except OSError:
        return {}
    return out


def pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


class RssSampler:
    """Samples one process's VmRSS in a thread; `mark(name)` records the current peak."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self.cpu_seen: float | None = None  # its CPU seconds at the last sample (kept after it exits)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = vm_rss(self.pid)
            if rss is not None:
                self.peak = max(self.peak, rss)
                self.samples += 1
                self.cpu_seen = process_cpu_seconds(self.pid) or self.cpu_seen
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self.before = vm_rss(self.pid) or 0
        self.cpu_before = process_cpu_seconds(self.pid) or 0.0
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *exc: t.Any) -> None:
        self._stop.set()
        self._thread.join()
        self.after = vm_rss(self.pid) or 0
        self.cpu_seen = process_cpu_seconds(self.pid) or self.cpu_seen

    @property
    def cpu_seconds(self) -> float | None:
        """CPU seconds it spent while sampled (up to its last sample, if it exited)."""
        return None if self.cpu_seen is None else self.cpu_seen - self.cpu_before

    def report(self) -> dict[str, t.Any]:
        return {"before_mib": self.before / MiB, "peak_mib": self.peak / MiB, "after_mib": self.after / MiB,
                "growth_mib": (self.peak - self.before) / MiB, "samples": self.samples}


# --------------------------------------------------------------------- running and reporting


def run_section(fn: t.Callable[[], dict[str, t.Any]], log: t.Callable[[str], None]) -> dict[str, t.Any]:
    """One benchmark's result, with `status` ("ok" or the error) and the host's load
    meanwhile. An error is logged with its traceback, not raised: one broken benchmark
    must not lose the others' numbers."""
    load = HostLoad()
    try:
        r = fn()
        r["status"] = "ok"
    except Exception as exc:
        r = {"status": f"error: {type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        log(r["traceback"])
    r["host_load"] = load.finish()
    return r


def fmt(v: t.Any, digits: int = 1) -> str:
    """A figure as the tables show it: `digits` decimals below 10, fewer above."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.{digits + 1}f}"
    return str(v)


def result_rows(r: dict[str, t.Any]) -> list[tuple[str, ...]]:
    """A benchmark's `rows` (label, stat, ours, baseline, ratio, target) as table text."""
    return [(label, stat, fmt(ours), fmt(base), (fmt(rat, 2) + "x") if rat is not None else "-", target)
            for label, stat, ours, base, rat, target in r["rows"]]


def markdown_table(head: t.Sequence[t.Any], rows: t.Sequence[t.Sequence[t.Any]]) -> str:
    """A Markdown table with its columns padded to line up in a terminal too."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)])


# --------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with this checkout on PYTHONPATH, for child processes (servers, kernels)."""
    return source_env(env)


def server_settings(settings: t.Iterable[str]) -> tuple[str, ...]:
    """`serve` arguments for a benchmark's ``--set NAME=VALUE`` options."""
    return tuple(arg for setting in settings for arg in ("--set", setting))


class BenchServer:
    """A sandbox server of our own: own port, own state dir (kept, so the image is built once).

    Started with --delete-on-shutdown so that no sandbox (pooled ones included) outlives
    the benchmark run.
    """

    def __init__(self, state_dir: str, pool_size: int = 2, log=print, extra_args: tuple[str, ...] = ()) -> None:
        self.state_dir = pathlib.Path(state_dir)
        self.extra_args = extra_args
        self.pool_size = pool_size
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.process: ServerProcess | None = None
        self.log = log
        self.log_path = self.state_dir / "bench-server.log"
        self.leftovers: list[str] = []

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def start(self, timeout: float = 900.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o711)
        other = self._other_server()
        if other:
            raise RuntimeError(f"another server (pid {other}) uses the state dir {self.state_dir}; "
                               "stop it or pass another --state-dir")
        env = source_env()
        env["SANDBOX_KERNEL_TOKEN"] = self.token
        env.pop("SANDBOX_KERNEL_URL", None)
        first_build = not (self.state_dir / "images" / "default").exists()
        if first_build:
            self.log(f"  building the default image in {self.state_dir} (once; about a minute)")
        self.process = ServerProcess(
            serve_command(self.state_dir, "--port", str(self.port), "--pool-size", str(self.pool_size),
                          "--delete-on-shutdown", "--log-level", "warning", *self.extra_args),
            self.log_path, env=env, cwd=REPO,
        )
        self.process.start()
        try:
            self.process.wait_healthy(self.url, timeout)
        except ServerStartError:
            self.stop()
            raise
        with self.client() as c:
            for sbx in c.get("/v1/sandboxes").json()["sandboxes"]:  # left over by an earlier run
                c.delete(f"/v1/sandboxes/{sbx['id']}")
        self.wait_pool(timeout=300)

    def _other_server(self) -> int | None:
        try:
            info = json.loads((self.state_dir / "server.json").read_text())
        except (OSError, ValueError):
            return None
        pid = info.get("pid")
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"sandbox" in f.read():
                    return pid
        except (OSError, TypeError):
            return None
        return None

    def pool(self) -> dict[str, t.Any]:
        r = httpx.get(self.url + "/v1/info", headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()["pool"].get("default", {"ready": 0, "target": 0})

    def wait_pool(self, timeout: float = 120.0, settle: float = 0.3) -> float:
        """Wait until the warm pool is full again; returns the seconds it took."""
        t0 = time.monotonic()
        if self.pool_size <= 0:
            return 0.0
        while time.monotonic() - t0 < timeout:
            p = self.pool()
            if p.get("ready", 0) >= p.get("target", self.pool_size):
                took = time.monotonic() - t0
                time.sleep(settle)  # let the refill's last imports finish their page-cache work
                return took
            time.sleep(0.1)  # each /v1/info runs the doctor (a bwrap probe): do not poll harder
        raise TimeoutError(f"the warm pool did not refill within {timeout} s: {self.pool()}")

    def image_python(self) -> str:
        """The default image's interpreter, for host-side baselines with the same packages."""
        path = self.state_dir / "images" / "default" / "venv" / "bin" / "python"
        return str(path) if path.exists() else sys.executable

    def sandbox_dir(self, sandbox_id: str) -> pathlib.Path:
        return self.state_dir / "sandboxes" / sandbox_id

    def supervisor_pid(self, sandbox_id: str) -> int | None:
        try:
            return json.loads((self.sandbox_dir(sandbox_id) / "state.json").read_text()).get("supervisor_pid")
        except (OSError, ValueError):
            return None

    def log_tail(self, n: int = 30) -> str:
        return log_tail(self.log_path, n)

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            with self.client(timeout=30) as c:
                for sbx in c.get("/v1/sandboxes").json()["sandboxes"]:
                    c.delete(f"/v1/sandboxes/{sbx['id']}")
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        self.process.stop(timeout=60)
        self.process = None
        self.leftovers = self.end_leftover_supervisors()
        if self.leftovers:
            self.log(f"  ended {len(self.leftovers)} sandboxes the server left running: {', '.join(self.leftovers)}")

    def end_leftover_supervisors(self, timeout: float = 15.0) -> list[str]:
        """SIGTERM ("end this sandbox") to every supervisor of this state dir still alive.

        `--delete-on-shutdown` does not delete the warm pool's sandboxes (the manager's
        delete() answers 404 for pooled ones), so without this they would outlive the run.
        """
        ended: dict[str, int] = {}
        for d in sorted((self.state_dir / "sandboxes").glob("sbx-*")):
            try:
                pid = json.loads((d / "state.json").read_text()).get("supervisor_pid")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except (OSError, ValueError, TypeError):
                continue
            if b"sandbox.supervisor" in cmd and str(d).encode() in cmd:
                os.kill(pid, signal.SIGTERM)
                ended[d.name] = pid
        deadline = time.monotonic() + timeout
        while ended and time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in ended.values()):
            time.sleep(0.1)
        # What the server would have cleaned up had it been running (a supervisor ending on
        # its own does not always get to its teardown): the cgroup, the workspace mount.
        from sandbox.isolation.host import HostResources

        for name in ended:
            d = self.state_dir / "sandboxes" / name
            try:
                HostResources.left_behind(str(d), json.loads((d / "state.json").read_text())).release()
            except (OSError, ValueError, RuntimeError):
                continue
        return list(ended)


# --------------------------------------------------------------------- API helpers


def execute(client: httpx.Client, sandbox_id: str, code: str, **fields: t.Any) -> list[dict[str, t.Any]]:
    r = client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields})
    r.raise_for_status()
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def execute_timed(client: httpx.Client, sandbox_id: str, code: str, **fields: t.Any) -> list[tuple[float, dict[str, t.Any]]]:
    """The execute's events, each with the seconds since the request when its line arrived."""
    t0 = time.monotonic()
    timed = []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.strip():
                timed.append((time.monotonic() - t0, json.loads(line)))
    return timed


def done_of(events: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    if not events or events[-1].get("type") != "done":
        raise RuntimeError(f"the execute stream did not end with done: {events[-3:]}")
    return events[-1]


def stdout_of(events: list[dict[str, t.Any]]) -> str:
    return "".join(e["text"] for e in events if e.get("type") == "stream" and e.get("name") == "stdout")


def create(client: httpx.Client, **fields: t.Any) -> dict[str, t.Any]:
    r = client.post("/v1/sandboxes", json=fields)
    if r.status_code != 201:
        raise RuntimeError(f"create answered {r.status_code}: {r.text[:300]}")
    return r.json()


def delete(client: httpx.Client, sandbox_id: str) -> None:
    client.delete(f"/v1/sandboxes/{sandbox_id}")
