"""The gateway's cost: `python -m bench.gateway_bench [--quick] [--state-dir DIR]`.

Starts a node server of its own (``--node-id bench1``, own port, token, ``--delete-on-shutdown``)
and a gateway in front of it, both on loopback, then measures, each figure against the same
thing done straight on the node, interleaved (ABAB, order flipped every sample):

- **latency**: a trivial execute (`x = 1`, the whole NDJSON answer read) through the gateway
  vs on the node; the ratio of p50s is the gateway's added latency (target <= 1.1x);
- **throughput**: N sandboxes executing `x = 1` at once, each client with its own
  connection, through the gateway vs on the node; the gateway's CPU per execute gives the
  executes/s one gateway process (one core) can carry;
- **memory**: the gateway's VmRSS, sampled every 5 ms, while 100 MiB are pushed (and pulled)
  through it, with the push rate against a push straight to the node.

Writes bench/results/gateway-latest.json and prints a table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import pathlib
import sys
import time
import typing as t

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    __package__ = "bench"

import httpx  # noqa: E402

from bench import harness  # noqa: E402
from bench.harness import (MiB, BenchServer, RssSampler, create, done_of, free_port,  # noqa: E402
                           markdown_table, process_cpu_seconds, ratio, result_rows, run_section, summary)
from bench.service_bench import _chunks, blob_file  # noqa: E402
from sandbox.service.server_process import ServerProcess, source_env  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
FULL = {"latency_reps": 300, "warmup": 30, "sandboxes": 10, "cells": 60, "rounds": 4, "files_reps": 3}
QUICK = {"latency_reps": 40, "warmup": 5, "sandboxes": 4, "cells": 20, "rounds": 2, "files_reps": 1}


class BenchGateway:
    def __init__(self, node: BenchServer):
        self.node = node
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = node.state_dir / "bench-gateway.log"
        self.process: ServerProcess | None = None

    def start(self) -> None:
        env = source_env()
        env["SANDBOX_KERNEL_TOKEN"] = self.node.token
        self.process = ServerProcess(
            [sys.executable, "-m", "sandbox", "gateway", "--port", str(self.port), "--node", self.node.url,
             "--log-level", "warning"],
            self.log_path, env=env, cwd=harness.REPO,
        )
        self.process.start()
        self.process.wait_healthy(self.url, 60)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.node.headers, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _execute(client: httpx.Client, sandbox_id: str) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": "x = 1"}) as r:
        lines = [line for line in r.iter_lines() if line]
    took = time.perf_counter() - t0
    if json.loads(lines[-1]).get("status") != "ok":
        raise RuntimeError(f"x = 1 failed: {lines[-1]}")
    return took


def bench_latency(node: BenchServer, gw: BenchGateway, reps: int, warmup: int) -> dict[str, t.Any]:
    with node.client() as direct, gw.client() as through:
        sandbox_id = create(through)["id"]
        try:
            for _ in range(warmup):
                _execute(direct, sandbox_id)
                _execute(through, sandbox_id)
            a, b = [], []
            cpu0 = process_cpu_seconds(gw.pid) or 0.0
            for i in range(reps):
                if i % 2 == 0:
                    a.append(_execute(through, sandbox_id))
                    b.append(_execute(direct, sandbox_id))
                else:
                    b.append(_execute(direct, sandbox_id))
                    a.append(_execute(through, sandbox_id))
            cpu = (process_cpu_seconds(gw.pid) or 0.0) - cpu0
        finally:
            through.delete(f"/v1/sandboxes/{sandbox_id}")
    sa, sb = summary(a, 1000), summary(b, 1000)
    r50 = ratio(sa["p50"], sb["p50"])
    return {
        "metrics": {"through_gateway_ms": sa, "direct_ms": sb, "gateway_cpu_ms_per_execute": 1000 * cpu / reps},
        "ratio_p50": r50, "target": "<= 1.1x", "meets_target": r50 is not None and r50 <= 1.1,
        "rows": [("trivial execute x=1, gateway vs direct (ms)", "p50", sa["p50"], sb["p50"], r50, "<= 1.1x"),
                 ("trivial execute x=1, gateway vs direct (ms)", "p95", sa["p95"], sb["p95"], ratio(sa["p95"], sb["p95"]), ""),
                 ("  added by the gateway (ms)", "p50", sa["p50"] - sb["p50"], None, None, ""),
                 ("  gateway CPU per execute (ms)", "mean", 1000 * cpu / reps, None, None, "")],
    }


async def _burst(url: str, headers: dict, ids: list[str], cells: int) -> tuple[list[float], float, int]:
    clients = [httpx.AsyncClient(base_url=url, headers=headers, timeout=300) for _ in ids]
    lat: list[float] = []
    errors = 0

    async def worker(client: httpx.AsyncClient, sandbox_id: str) -> None:
        nonlocal errors
        for _ in range(cells):
            t0 = time.perf_counter()
            r = await client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": "x = 1"})
            lat.append(time.perf_counter() - t0)
            if r.status_code != 200 or '"status": "ok"' not in r.text.splitlines()[-1]:
                errors += 1

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(c, s) for c, s in zip(clients, ids)))
        return lat, time.perf_counter() - t0, errors
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def bench_throughput(node: BenchServer, gw: BenchGateway, sandboxes: int, cells: int, rounds: int) -> dict[str, t.Any]:
    with gw.client() as c:
        ids = [create(c)["id"] for _ in range(sandboxes)]
    try:
        asyncio.run(_burst(gw.url, node.headers, ids, 2))  # warm-up: connections, first cells
        res = {"gateway": ([], 0.0, 0, 0), "direct": ([], 0.0, 0, 0)}
        gw_cpu = 0.0
        per_round = max(1, cells // rounds)
        for r in range(rounds):
            order = ("gateway", "direct") if r % 2 == 0 else ("direct", "gateway")
            for arm in order:
                cpu0 = process_cpu_seconds(gw.pid) or 0.0
                lat, wall, errors = asyncio.run(_burst(gw.url if arm == "gateway" else node.url, node.headers, ids, per_round))
                if arm == "gateway":
                    gw_cpu += (process_cpu_seconds(gw.pid) or 0.0) - cpu0
                old = res[arm]
                res[arm] = (old[0] + lat, old[1] + wall, old[2] + errors, old[3] + len(lat))
    finally:
        with gw.client() as c:
            for sandbox_id in ids:
                c.delete(f"/v1/sandboxes/{sandbox_id}")
    tput = {arm: v[3] / v[1] for arm, v in res.items()}
    cpu_ms = 1000 * gw_cpu / res["gateway"][3]
    lg, ld = summary(res["gateway"][0], 1000), summary(res["direct"][0], 1000)
    return {
        "metrics": {"sandboxes": sandboxes, "executes_per_arm": res["gateway"][3], "throughput_per_s": tput,
                    "latency_ms": {"gateway": lg, "direct": ld}, "errors": {a: v[2] for a, v in res.items()},
                    "gateway_cpu_ms_per_execute": cpu_ms,
                    "executes_per_s_per_gateway_core": 1000 / cpu_ms if cpu_ms else None},
        "target": "reported", "meets_target": None,
        "rows": [(f"{sandboxes} sandboxes at once, gateway vs direct (executes/s)", "mean", tput["gateway"], tput["direct"],
                  ratio(tput["gateway"], tput["direct"]), ""),
                 (f"{sandboxes} sandboxes at once, gateway vs direct (ms)", "p50", lg["p50"], ld["p50"], ratio(lg["p50"], ld["p50"]), ""),
                 ("  gateway CPU per execute (ms)", "mean", cpu_ms, None, None, ""),
                 ("  executes/s one gateway core carries (1000 / CPU ms)", "est", 1000 / cpu_ms if cpu_ms else None, None, None, "")],
    }


def bench_files(node: BenchServer, gw: BenchGateway, reps: int) -> dict[str, t.Any]:
    src, digest = blob_file()
    size = os.path.getsize(src)
    with gw.client(timeout=600) as through, node.client(timeout=600) as direct:
        sandbox_id = create(through)["id"]
        url = f"/v1/sandboxes/{sandbox_id}/files/blob.bin"

        def push(client: httpx.Client) -> float:
            t0 = time.perf_counter()
            with open(src, "rb") as f:
                r = client.put(url, content=_chunks(f))
            if r.status_code != 201 or r.json().get("size") != size:
                raise RuntimeError(f"push answered {r.status_code}: {r.text[:300]}")
            return time.perf_counter() - t0

        def pull(client: httpx.Client) -> float:
            import hashlib

            h = hashlib.sha256()
            t0 = time.perf_counter()
            with client.stream("GET", url) as r:
                for chunk in r.iter_raw(MiB):
                    h.update(chunk)
            took = time.perf_counter() - t0
            if h.hexdigest() != digest:
                raise RuntimeError("the pulled file differs")
            return took

        try:
            push(through)  # warm-up
            a, b, pa, pb = [], [], [], []
            with RssSampler(gw.pid) as rss:
                for i in range(reps):
                    for arm in (("gw", "node") if i % 2 == 0 else ("node", "gw")):
                        (a if arm == "gw" else b).append(push(through if arm == "gw" else direct))
                    pa.append(pull(through))
                    pb.append(pull(direct))
        finally:
            through.delete(f"/v1/sandboxes/{sandbox_id}")
    mibs = lambda xs: [size / MiB / x for x in xs]  # noqa: E731
    sa, sb, spa, spb = (summary(mibs(x)) for x in (a, b, pa, pb))
    rep = rss.report()
    return {
        "metrics": {"push_mib_s": {"gateway": sa, "direct": sb}, "pull_mib_s": {"gateway": spa, "direct": spb},
                    "gateway_rss": rep, "file_mib": size / MiB},
        "target": "RSS growth << file size", "meets_target": rep["growth_mib"] < 0.2 * size / MiB,
        "rows": [("gateway RSS while 100 MiB stream through: peak - before (MiB)", "max", rep["growth_mib"], size / MiB,
                  ratio(rep["growth_mib"], size / MiB), "<< file size"),
                 ("push 100 MiB, gateway vs direct (MiB/s)", "p50", sa["p50"], sb["p50"], ratio(sa["p50"], sb["p50"]), ""),
                 ("pull 100 MiB, gateway vs direct (MiB/s)", "p50", spa["p50"], spb["p50"], ratio(spa["p50"], spb["p50"]), "")],
    }


def main(argv: list[str] | None = None) -> int:
    from bench.run import machine

    parser = argparse.ArgumentParser(prog="python -m bench.gateway_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", harness.DEFAULT_STATE_DIR))
    parser.add_argument("--out", default=str(RESULTS / "gateway-latest.json"))
    args = parser.parse_args(argv)
    params = QUICK if args.quick else FULL
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    doc: dict[str, t.Any] = {"started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             "mode": "quick" if args.quick else "full", "params": params, "machine": machine(),
                             "results": {}}
    node = BenchServer(args.state_dir, pool_size=1, log=log, extra_args=("--node-id", "bench1"))
    node.start()
    gw = BenchGateway(node)
    try:
        gw.start()
        for name, fn in (("latency", lambda: bench_latency(node, gw, params["latency_reps"], params["warmup"])),
                         ("throughput", lambda: bench_throughput(node, gw, params["sandboxes"], params["cells"], params["rounds"])),
                         ("files", lambda: bench_files(node, gw, params["files_reps"]))):
            log(f"[{name}]")
            r = run_section(fn, log)
            doc["results"][name] = r
            node.wait_pool()
    finally:
        gw.stop()
        node.stop()
    RESULTS.mkdir(exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
    rows: list[tuple[str, ...]] = []
    for name, r in doc["results"].items():
        rows += result_rows(r) if r["status"] == "ok" else [(name, r["status"][:80], "", "", "", "")]
    print(markdown_table(("benchmark", "stat", "gateway", "direct", "ratio", "target"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
