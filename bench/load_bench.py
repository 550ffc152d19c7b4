"""Benchmarks 6 and 7: memory per idle sandbox, latency under concurrency, and the
reliability load (many clients streaming small cells at once).

The clients are asyncio tasks sharing one httpx.AsyncClient, in this process: on a
2-core host they compete with the server for CPU, as real co-located clients would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import typing as t
from concurrent.futures import ThreadPoolExecutor

import httpx

from .harness import (MiB, BenchServer, RssSampler, create, delete, done_of, execute, pids_of_uid, process_cpu_seconds,
                      ratio, schedstat, smaps_rollup, summary)


class Fleet:
    """N running sandboxes with pandas imported, made once and shared by 6 and 7."""

    def __init__(self, server: BenchServer) -> None:
        self.server = server
        self.ids: list[str] = []
        self.create_errors: list[str] = []

    def grow(self, n: int, parallel: int = 4) -> float:
        missing = n - len(self.ids)
        if missing <= 0:
            return 0.0
        t0 = time.perf_counter()

        def one(_: int) -> str | None:
            with self.server.client(timeout=300) as c:
                try:
                    sbx = create(c)
                    done = done_of(execute(c, sbx["id"], "import pandas"))
                    if done["status"] != "ok":
                        raise RuntimeError(f"import pandas: {done}")
                    return sbx["id"]
                except Exception as exc:
                    self.create_errors.append(f"{type(exc).__name__}: {exc}")
                    return None

        with ThreadPoolExecutor(parallel) as pool:
            self.ids += [i for i in pool.map(one, range(missing)) if i]
        took = time.perf_counter() - t0
        self.server.wait_pool(timeout=300)  # no refill competes with what is timed next
        return took

    def close(self) -> None:
        def one(sandbox_id: str) -> None:
            with self.server.client(timeout=120) as c:
                delete(c, sandbox_id)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, self.ids))
        self.ids = []


def bench_density(server: BenchServer, fleet: Fleet, n: int, setup) -> dict[str, t.Any]:
    """Benchmark 6a: memory of N idle sandboxes with pandas imported.

    Per sandbox: the cgroup's memory usage as the API reports it (`memory_bytes`, which in
    cgroup v1 includes page cache charged to the group), the PSS and RSS of the sandbox's
    own processes (found by its host uid), and the PSS of its supervisor on the host.
    Baselines: a plain ipykernel with pandas imported, and a bare `python -c "import pandas"`.
    """
    fleet.grow(n)
    ids = fleet.ids[:n]
    time.sleep(1.0)
    cg: list[float] = []
    pss: list[float] = []
    rss: list[float] = []
    sup_pss: list[float] = []
    nprocs: list[int] = []
    with server.client() as c:
        for sandbox_id in ids:
            sbx = c.get(f"/v1/sandboxes/{sandbox_id}").json()
            if sbx.get("memory_bytes") is not None:
                cg.append(sbx["memory_bytes"])
            uid = sbx.get("isolation", {}).get("host_uid")
            if uid is not None:
                procs = [smaps_rollup(p) for p in pids_of_uid(int(uid))]
                pss.append(sum(p.get("pss", 0) for p in procs))
                rss.append(sum(p.get("rss", 0) for p in procs))
                nprocs.append(len(procs))
            sup = server.supervisor_pid(sandbox_id)
            if sup:
                sup_pss.append(smaps_rollup(sup).get("pss", 0))
    # baselines: a bare interpreter with pandas; a plain ipykernel with pandas
    bare = subprocess.Popen([server.image_python(), "-c", "import pandas, sys; print('ok', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    bare.stdout.readline()
    time.sleep(0.3)
    bare_mem = smaps_rollup(bare.pid)
    bare.stdin.close()
    bare.wait(10)
    ipk_mem: dict[str, int] = {}
    # plain ipykernel needs only jupyter_client and ipykernel, not our kernel
    try:
        from .kernel_bench import _kernel_pid, run_cell, stop

        km, kc = setup.start("python3")
        try:
            run_cell(kc, "import pandas")
            time.sleep(0.3)
            pid = _kernel_pid(km)
            ipk_mem = smaps_rollup(pid) if pid else {}
        finally:
            stop(km, kc)
    except Exception as exc:  # report without the baseline rather than fail
        ipk_mem = {"error": str(exc)}  # type: ignore[dict-item]
    m = lambda xs: summary([x / MiB for x in xs])  # noqa: E731
    s_cg, s_pss, s_rss, s_sup = m(cg), m(pss), m(rss), m(sup_pss)
    per_sandbox_pss = (s_pss.get("mean") or 0) + (s_sup.get("mean") or 0)
    ipk_pss = ipk_mem.get("pss", 0) / MiB if isinstance(ipk_mem.get("pss"), int) else None
    return {
        "metrics": {"sandboxes": len(ids), "cgroup_memory_mib": s_cg, "sandbox_pss_mib": s_pss, "sandbox_rss_mib": s_rss,
                    "supervisor_pss_mib": s_sup, "processes_per_sandbox": nprocs[:1],
                    "per_sandbox_total_pss_mib": per_sandbox_pss,
                    "plain_ipykernel_pandas": {k: v / MiB if isinstance(v, int) else v for k, v in ipk_mem.items()},
                    "bare_python_pandas": {k: v / MiB for k, v in bare_mem.items()}},
        "ratio_p50": ratio(per_sandbox_pss, ipk_pss),
        "target": "reported only",
        "meets_target": None,
        "rows": [
            (f"idle sandbox w/ pandas, cgroup memory_bytes (MiB, N={len(ids)})", "p50", s_cg.get("p50"),
             (ipk_mem.get("rss") or 0) / MiB or None, ratio(s_cg.get("p50"), (ipk_mem.get("rss") or 0) / MiB or None),
             "vs ipykernel RSS"),
            ("idle sandbox w/ pandas, PSS sandbox+supervisor (MiB)", "mean", per_sandbox_pss, ipk_pss,
             ratio(per_sandbox_pss, ipk_pss), "vs ipykernel PSS"),
            ("  of which supervisor PSS (MiB)", "mean", s_sup.get("mean"), None, None, ""),
        ],
    }


# --------------------------------------------------------------------------- concurrency


async def _worker(client: httpx.AsyncClient, sandbox_id: str, cells: list[str], check: t.Callable | None,
                  lat: list[float], errors: list[str], start: asyncio.Event, mine: list[float]) -> None:
    await start.wait()
    for i, code in enumerate(cells):
        t0 = time.perf_counter()
        try:
            # read the NDJSON stream line by line, as the kernel does, until its done event
            events: list[dict] = []
            async with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code}) as r:
                if r.status_code != 200:
                    body = (await r.aread()).decode(errors="replace")
                    errors.append(f"{sandbox_id} cell {i}: HTTP {r.status_code} {body[:200]}")
                    continue
                async for line in r.aiter_lines():
                    if line.strip():
                        events.append(json.loads(line))
            dt = time.perf_counter() - t0
            done = events[-1] if events else {}
            if done.get("type") != "done" or done.get("status") != "ok":
                errors.append(f"{sandbox_id} cell {i}: {events[-2:]}")
                continue
            if check is not None:
                problem = check(i, events)
                if problem:
                    errors.append(f"{sandbox_id} cell {i}: {problem}")
                    continue
            lat.append(dt)
            mine.append(dt)
        except Exception as exc:
            errors.append(f"{sandbox_id} cell {i}: {type(exc).__name__}: {exc}")


async def _burst(server: BenchServer, ids: list[str], cells_for: t.Callable[[int], list[str]],
                 check_for: t.Callable[[int], t.Callable | None],
                 per_client: list[list[float]] | None = None) -> tuple[list[float], list[str], float]:
    """All clients start together; each has its own httpx.AsyncClient, as each kernel
    would (one shared pool of 50 connections costs httpcore O(connections) per request,
    which made this client, not the server, the bottleneck)."""
    clients = [httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=300) for _ in ids]
    try:
        lat: list[float] = []
        errors: list[str] = []
        start = asyncio.Event()
        mine: list[list[float]] = [[] for _ in ids]
        tasks = [asyncio.create_task(_worker(clients[k], sid, cells_for(k), check_for(k), lat, errors, start, mine[k]))
                 for k, sid in enumerate(ids)]
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        if per_client is not None:
            per_client.extend(mine)
        return lat, errors, wall
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def bench_concurrency(server: BenchServer, fleet: Fleet, levels: list[int], cells: int, rounds: int) -> dict[str, t.Any]:
    """Benchmark 6b: `x = 1` latency with 1, 10 and 50 sandboxes executing at once.

    Each level runs `cells` executes per sandbox, split into `rounds` bursts that alternate
    between the levels, so a burst of background load hits every level alike.
    """
    fleet.grow(max(levels))
    per_round = max(1, cells // rounds)
    lat: dict[int, list[float]] = {n: [] for n in levels}
    errors: dict[int, list[str]] = {n: [] for n in levels}
    wall: dict[int, float] = {n: 0.0 for n in levels}
    count: dict[int, int] = {n: 0 for n in levels}
    sched: dict[int, list[float]] = {n: [0.0, 0.0, 0.0, 0.0] for n in levels}  # server run/wait, client run/wait
    cpu0 = process_cpu_seconds(server.pid) or 0.0
    # warm-up: one cell in every sandbox
    asyncio.run(_burst(server, fleet.ids[:max(levels)], lambda k: ["x = 1"], lambda k: None))
    for r in range(rounds):
        for n in (levels if r % 2 == 0 else list(reversed(levels))):
            s0, c0 = schedstat(server.pid), schedstat(os.getpid())
            la, er, w = asyncio.run(_burst(server, fleet.ids[:n], lambda k: ["x = 1"] * per_round, lambda k: None))
            s1, c1 = schedstat(server.pid), schedstat(os.getpid())
            for j, v in enumerate((s1[0] - s0[0], s1[1] - s0[1], c1[0] - c0[0], c1[1] - c0[1])):
                sched[n][j] += v
            lat[n] += la
            errors[n] += er
            wall[n] += w
            count[n] += n * per_round
    cpu = (process_cpu_seconds(server.pid) or 0.0) - cpu0
    s = {n: summary(lat[n], 1000) for n in levels}
    base = s[levels[0]]
    rows = []
    for n in levels:
        rows.append((f"x=1 latency, {n} sandboxes at once vs 1 (ms)", "p50", s[n].get("p50"), base.get("p50"),
                     ratio(s[n].get("p50"), base.get("p50")), ""))
        rows.append((f"x=1 latency, {n} sandboxes at once vs 1 (ms)", "p99", s[n].get("p99"), base.get("p99"),
                     ratio(s[n].get("p99"), base.get("p99")), ""))
    rows.append(("  throughput at the top level vs 1 sandbox (executes/s)", "mean",
                 count[levels[-1]] / wall[levels[-1]], count[levels[0]] / wall[levels[0]],
                 ratio(count[levels[-1]] / wall[levels[-1]], count[levels[0]] / wall[levels[0]]), ""))
    total = sum(count.values()) + max(levels)
    return {
        "metrics": {"levels": levels, "cells_per_sandbox": per_round * rounds,
                    **{f"latency_ms_{n}": s[n] for n in levels},
                    **{f"throughput_per_s_{n}": count[n] / wall[n] for n in levels},
                    "errors": {n: len(errors[n]) for n in levels},
                    "error_examples": [e for n in levels for e in errors[n]][:5],
                    "server_cpu_ms_per_execute": 1000 * cpu / total if total else None,
                    # per execute: time the server / this client process ran, and waited runnable for a CPU
                    "sched_ms_per_execute": {n: {"server_run": 1000 * sched[n][0] / count[n],
                                                 "server_runqueue_wait": 1000 * sched[n][1] / count[n],
                                                 "client_run": 1000 * sched[n][2] / count[n],
                                                 "client_runqueue_wait": 1000 * sched[n][3] / count[n]}
                                             for n in levels}},
        "ratio_p50": ratio(s[levels[-1]].get("p50"), base.get("p50")),
        "target": "reported only", "meets_target": None, "rows": rows,
        "notes": [f"{sum(len(e) for e in errors.values())} errors"] if any(errors.values()) else [],
    }


def bench_load(server: BenchServer, fleet: Fleet, n: int, cells: int, single_p50_ms: float | None) -> dict[str, t.Any]:
    """Benchmark 7: N kernel-like clients, each running `cells` small cells that print a
    line unique to the client and the cell, all at once. Every output must come back to
    the client that asked, in order, with consecutive execution counts; errors are counted.
    """
    fleet.grow(n)
    ids = fleet.ids[:n]
    with server.client() as c:
        start_counts = {sid: c.get(f"/v1/sandboxes/{sid}").json()["execution_count"] for sid in ids}

    def cells_for(k: int) -> list[str]:
        return [f"i = {i}\nprint('client-{k}', i)" for i in range(cells)]

    def check_for(k: int):
        sid = ids[k]

        def check(i: int, events: list[dict]) -> str | None:
            text = "".join(e["text"] for e in events if e.get("type") == "stream" and e.get("name") == "stdout")
            if text != f"client-{k} {i}\n":
                return f"wrong output {text!r} (expected 'client-{k} {i}')"
            want = start_counts[sid] + i + 1
            if events[-1].get("execution_count") != want:
                return f"execution_count {events[-1].get('execution_count')} != {want}"
            return None
        return check

    cpu0 = process_cpu_seconds(server.pid) or 0.0
    s0, c0 = schedstat(server.pid), schedstat(os.getpid())
    per_client: list[list[float]] = []
    with RssSampler(server.pid, interval=0.01) as rss:
        lat, errors, wall = asyncio.run(_burst(server, ids, cells_for, check_for, per_client))
    s1, c1 = schedstat(server.pid), schedstat(os.getpid())
    cpu = (process_cpu_seconds(server.pid) or 0.0) - cpu0
    s = summary(lat, 1000)
    rep = rss.report()
    expected = n * cells
    return {
        "metrics": {"clients": n, "cells_per_client": cells, "expected_cells": expected, "ok_cells": len(lat),
                    "errors": len(errors), "error_examples": errors[:5], "latency_ms": s, "wall_s": wall,
                    # fairness: the spread of the clients' own median latencies
                    "per_client_p50_ms": summary([p for p in (summary(x, 1000).get("p50") for x in per_client) if p]),
                    "cells_per_s": expected / wall if wall else None, "server_rss": rep,
                    "server_cpu_ms_per_cell": 1000 * cpu / expected if expected else None,
                    "sched_ms_per_cell": {"server_run": 1000 * (s1[0] - s0[0]) / expected,
                                          "server_runqueue_wait": 1000 * (s1[1] - s0[1]) / expected,
                                          "client_run": 1000 * (c1[0] - c0[0]) / expected,
                                          "client_runqueue_wait": 1000 * (c1[1] - c0[1]) / expected}},
        "ratio_p50": ratio(s.get("p50"), single_p50_ms),
        "target": "0 errors, every output to its client", "meets_target": not errors and len(lat) == expected,
        "notes": [f"{len(errors)} errors, e.g. {errors[:2]}"] if errors else [],
        "rows": [
            (f"load: {n} clients x {cells} print cells, errors", "count", len(errors), 0, None, "0"),
            (f"load: {n} clients x {cells} print cells, latency vs 1 idle (ms)", "p50", s.get("p50"), single_p50_ms,
             ratio(s.get("p50"), single_p50_ms), ""),
            (f"load: {n} clients x {cells} print cells, latency (ms)", "p99", s.get("p99"), None, None, ""),
            ("  server RSS while outputs stream: before -> peak (MiB)", "max", rep["peak_mib"], rep["before_mib"],
             ratio(rep["peak_mib"], rep["before_mib"]), ""),
        ],
    }
