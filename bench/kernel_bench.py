"""Benchmarks 1 and 2: our Jupyter kernel against plain ipykernel, through the same
jupyter_client loop a notebook server uses.

Both kernels are started by `KernelManager` and driven by a `BlockingKernelClient`; a cell
counts as done when its execute_reply and its IOPub idle status have both arrived (what a
notebook waits for before it runs the next cell). Samples of the two kernels alternate,
so that load from other processes on the host falls on both alike.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile
import time
import typing as t

from kernel.drive import run_cell

from .harness import (BenchServer, create, delete, done_of, execute, pids_of_uid, ratio, schedstat, summary,
                      with_repo_on_path)

TRIVIAL = "x = 1"
FIRST_RESULT = ("import pandas as pd, matplotlib.pyplot as plt; df = pd.DataFrame({'a': range(10)}); "
                "df.plot(); plt.show()")


class KernelSetup:
    """The kernelspecs in a temporary prefix and the environment both kernels get."""

    def __init__(self, server: BenchServer) -> None:
        self.server = server
        self.prefix = pathlib.Path(tempfile.mkdtemp(prefix="sk-bench-jupyter-"))
        self.error: str | None = None
        self.log_path = server.state_dir / "bench-kernels.log"
        try:
            from kernel.install import install_kernelspec

            install_kernelspec(prefix=str(self.prefix))
        except Exception as exc:  # the kernel package is not there or not finished
            self.error = f"kernel unavailable: cannot install the kernelspec ({type(exc).__name__}: {exc})"
        jupyter_data = str(self.prefix / "share" / "jupyter")
        os.environ["JUPYTER_PATH"] = os.pathsep.join([jupyter_data, *[p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]])
        env = with_repo_on_path(dict(os.environ))
        env.update(SANDBOX_KERNEL_URL=server.url, SANDBOX_KERNEL_TOKEN=server.token, SANDBOX_KERNEL_START_SERVER="0")
        self.env = env

    def start(self, name: str, timeout: float = 120.0):
        from jupyter_client.manager import KernelManager

        km = KernelManager(kernel_name=name)
        log = open(self.log_path, "ab")
        try:
            # a notebook's folder of its own: the kernel refuses to start with its working
            # directory on sys.path, which the checkout is (PYTHONPATH) when run from it
            km.start_kernel(env=self.env, stdout=log, stderr=log, cwd=str(self.prefix))
        finally:
            log.close()
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=timeout)
        except Exception:
            stop(km, kc)
            raise
        return km, kc

    def check(self) -> str | None:
        """None when our kernel starts and runs a cell; else why not."""
        if self.error:
            return self.error
        try:
            km, kc = self.start("sandbox", timeout=120)
        except Exception as exc:
            return f"kernel unavailable: it did not start ({type(exc).__name__}: {exc})"
        try:
            reply, _ = run_cell(kc, "1 + 1", timeout=120)
            if reply["content"]["status"] != "ok":
                return f"kernel unavailable: a trivial cell answered {reply['content']}"
        except Exception as exc:
            return f"kernel unavailable: a trivial cell failed ({type(exc).__name__}: {exc})"
        finally:
            stop(km, kc)
        return None


def stop(km, kc) -> None:
    try:
        kc.stop_channels()
    except Exception:
        pass
    try:
        km.shutdown_kernel(now=False)
    except Exception:
        try:
            km.shutdown_kernel(now=True)
        except Exception:
            pass


def _kernel_pid(km) -> int | None:
    return getattr(getattr(getattr(km, "provisioner", None), "process", None), "pid", None)


def _cpu(pids: int | list[int] | None) -> float:
    if not pids:
        return 0.0
    return sum(schedstat(p)[0] for p in (pids if isinstance(pids, list) else [pids]))


def _cell_processes(server: BenchServer, km, exclude: str) -> dict[str, t.Any]:
    """The processes one cell of our kernel passes through: kernel, server, the kernel's
    sandbox's supervisor and its in-sandbox processes (found by the sandbox's host uid)."""
    out: dict[str, t.Any] = {"kernel process": _kernel_pid(km), "server": server.pid}
    with server.client() as c:
        mine = [s for s in c.get("/v1/sandboxes").json()["sandboxes"] if s["id"] != exclude]
    if len(mine) == 1:
        out["supervisor"] = server.supervisor_pid(mine[0]["id"])
        uid = mine[0].get("isolation", {}).get("host_uid")
        if uid is not None:
            out["sandbox (bwrap + runtime)"] = pids_of_uid(int(uid))
    return out


def bench_trivial_cell(server: BenchServer, setup: KernelSetup, reps: int, warmup: int) -> dict[str, t.Any]:
    """Benchmark 1: `x = 1` round trip, ours vs plain ipykernel (and the bare HTTP execute,
    to show how much of our time is the kernel's and how much the server's)."""
    km_ours, kc_ours = setup.start("sandbox")
    km_plain, kc_plain = setup.start("python3")
    http = server.client()
    sbx = create(http)
    server.wait_pool()  # both claims are refilled before anything is timed
    try:
        for _ in range(warmup):
            run_cell(kc_ours, TRIVIAL)
            run_cell(kc_plain, TRIVIAL)
            execute(http, sbx["id"], TRIVIAL)
        ours: list[float] = []
        plain: list[float] = []
        raw_http: list[float] = []
        runtime: list[float] = []
        statuses = set()
        # CPU each process spends per cell (schedstat, ns precision), read outside the timed window
        procs_ours = _cell_processes(server, km_ours, exclude=sbx["id"])
        procs_plain = {"kernel process": _kernel_pid(km_plain)}
        cpu: dict[str, dict[str, float]] = {"ours": {k: 0.0 for k in procs_ours},
                                            "plain": {k: 0.0 for k in procs_plain}}

        def timed(kc, which: str) -> float:
            procs = procs_ours if which == "ours" else procs_plain
            before = {k: _cpu(p) for k, p in procs.items()}
            t0 = time.perf_counter()
            reply, _ = run_cell(kc, TRIVIAL)
            dt = time.perf_counter() - t0
            for k, p in procs.items():
                cpu[which][k] += _cpu(p) - before[k]
            statuses.add(reply["content"]["status"])
            return dt

        for i in range(reps):
            # alternate which goes first, so neither always follows the other's GC/IO
            order = ("ours", "plain", "http") if i % 2 == 0 else ("http", "plain", "ours")
            for which in order:
                if which == "ours":
                    ours.append(timed(kc_ours, "ours"))
                elif which == "plain":
                    plain.append(timed(kc_plain, "plain"))
                else:
                    t0 = time.perf_counter()
                    events = execute(http, sbx["id"], TRIVIAL)
                    raw_http.append(time.perf_counter() - t0)
                    runtime.append(done_of(events).get("duration") or 0.0)
    finally:
        stop(km_ours, kc_ours)
        stop(km_plain, kc_plain)
        delete(http, sbx["id"])
        http.close()
    s_ours, s_plain, s_http = summary(ours, 1000), summary(plain, 1000), summary(raw_http, 1000)
    r50 = ratio(s_ours["p50"], s_plain["p50"])
    cpu_ours = 1000 * sum(cpu["ours"].values()) / reps
    cpu_plain = 1000 * sum(cpu["plain"].values()) / reps
    r_cpu = ratio(cpu_ours, cpu_plain)
    return {
        "metrics": {"ours_kernel_ms": s_ours, "plain_ipykernel_ms": s_plain, "ours_http_execute_ms": s_http,
                    "runtime_duration_ms": summary(runtime, 1000), "reply_statuses": sorted(statuses),
                    "cpu_ms_per_cell": {w: {k: 1000 * v / reps for k, v in d.items()} for w, d in cpu.items()}},
        "ratio_p50": r50, "ratio_p95": ratio(s_ours["p95"], s_plain["p95"]),
        "ratio_cpu": r_cpu, "target": "ours p50 <= 1.05x plain, CPU per cell <= 1.2x plain (quiet host)",
        "meets_target": r50 is not None and r50 <= 1.05 and r_cpu is not None and r_cpu <= 1.2,
        "rows": [
            ("trivial cell x=1 (ms)", "p50", s_ours["p50"], s_plain["p50"], r50, "<= 1.05x"),
            ("trivial cell x=1 (ms)", "p95", s_ours["p95"], s_plain["p95"], ratio(s_ours["p95"], s_plain["p95"]), ""),
            ("  of which HTTP execute (ms)", "p50", s_http["p50"], s_plain["p50"], ratio(s_http["p50"], s_plain["p50"]), ""),
            ("  CPU per cell, all our processes vs ipykernel (ms)", "mean", cpu_ours, cpu_plain, r_cpu, "<= 1.2x"),
        ],
    }


def bench_first_result(server: BenchServer, setup: KernelSetup, reps: int) -> dict[str, t.Any]:
    """Benchmark 2: kernel start to the first pandas+matplotlib figure, ours (warm pool with
    pandas and matplotlib preloaded) vs plain ipykernel importing them cold.

    Between samples the kernel is shut down and, for ours, the pool is allowed to refill:
    the figure is what a user sees who opens a notebook on a server that is not saturated.
    """
    missing = [m for m in ("pandas", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:  # the baseline kernel runs on this interpreter
        raise RuntimeError(f"the plain ipykernel baseline needs {', '.join(missing)} here: "
                           "pip install -e '.[bench]'")
    samples: dict[str, list[float]] = {"sandbox": [], "python3": []}
    ready: dict[str, list[float]] = {"sandbox": [], "python3": []}
    refill: list[float] = []

    def one(name: str) -> None:
        t0 = time.perf_counter()
        km, kc = setup.start(name)
        t_ready = time.perf_counter() - t0
        try:
            reply, outputs = run_cell(kc, FIRST_RESULT, timeout=180)
            total = time.perf_counter() - t0
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"{name}: the cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
            if not any("image/png" in m["content"].get("data", {}) for m in outputs if m["msg_type"] == "display_data"):
                raise RuntimeError(f"{name}: the figure has no image/png")
        finally:
            stop(km, kc)
        samples[name].append(total)
        ready[name].append(t_ready)
        if name == "sandbox":
            refill.append(server.wait_pool())

    # one unrecorded warm-up of each: the first ever start pays for cold page cache
    for name in ("sandbox", "python3"):
        one(name)
        samples[name].clear()
        ready[name].clear()
    refill.clear()
    for i in range(reps):
        for name in (("sandbox", "python3") if i % 2 == 0 else ("python3", "sandbox")):
            one(name)
    s_ours, s_plain = summary(samples["sandbox"], 1000), summary(samples["python3"], 1000)
    r50 = ratio(s_ours["p50"], s_plain["p50"])
    return {
        "metrics": {"ours_ms": s_ours, "plain_ms": s_plain,
                    "ours_kernel_ready_ms": summary(ready["sandbox"], 1000),
                    "plain_kernel_ready_ms": summary(ready["python3"], 1000),
                    "pool_refill_s": summary(refill)},
        "ratio_p50": r50, "target": "ours p50 <= plain p50", "meets_target": r50 is not None and r50 <= 1.0,
        "rows": [
            ("first pandas+mpl figure from kernel start (ms)", "p50", s_ours["p50"], s_plain["p50"], r50, "<= 1.0x"),
            ("first pandas+mpl figure from kernel start (ms)", "p95", s_ours["p95"], s_plain["p95"],
             ratio(s_ours["p95"], s_plain["p95"]), ""),
            ("  of which kernel start to ready (ms)", "p50", summary(ready["sandbox"], 1000)["p50"],
             summary(ready["python3"], 1000)["p50"], None, ""),
        ],
    }


BIG_PRINT = "print('x' * 30_000_000)"


def bench_big_print(server: BenchServer, setup: KernelSetup, reps: int) -> dict[str, t.Any]:
    """Benchmark 10: a 30 MB `print`, from `kc.execute()` to reply and idle, ours vs plain
    ipykernel, and the bytes of stream text each delivers. Ours drops what is past its stream
    limit (1 MiB) in the sandbox and ends with a note; ipykernel sends all 30 MB, which a
    Jupyter server (not in this loop) would cut with "IOPub data rate exceeded"."""
    km_ours, kc_ours = setup.start("sandbox")
    km_plain, kc_plain = setup.start("python3")
    seconds: dict[str, list[float]] = {"ours": [], "plain": []}
    received: dict[str, int] = {}
    try:
        run_cell(kc_ours, "pass", timeout=120)  # the sandbox claimed before anything is timed
        for i in range(reps):
            for which in (("ours", "plain") if i % 2 == 0 else ("plain", "ours")):
                kc = kc_ours if which == "ours" else kc_plain
                t0 = time.perf_counter()
                reply, outputs = run_cell(kc, BIG_PRINT, timeout=600)
                seconds[which].append(time.perf_counter() - t0)
                assert reply["content"]["status"] == "ok", reply["content"]
                received[which] = sum(len(m["content"]["text"]) for m in outputs if m["msg_type"] == "stream")
    finally:
        stop(km_ours, kc_ours)
        stop(km_plain, kc_plain)
    s_ours, s_plain = summary(seconds["ours"], 1000), summary(seconds["plain"], 1000)
    r50 = ratio(s_ours["p50"], s_plain["p50"])
    return {
        "metrics": {"ours_ms": s_ours, "plain_ipykernel_ms": s_plain, "stream_chars_received": received},
        "ratio_p50": r50, "target": "about the time ipykernel takes (<= 1.5x)",
        "meets_target": r50 is not None and r50 <= 1.5,
        "rows": [
            ("print of 30 MB (ms)", "p50", s_ours["p50"], s_plain["p50"], r50, "<= 1.5x"),
            ("  stream text received (chars)", "last", received.get("ours"), received.get("plain"),
             ratio(received.get("ours"), received.get("plain")), ""),
        ],
    }
