"""Run the benchmark suite: `python -m bench [--quick] [--only NAME ...] [--state-dir DIR]`.

Starts its own sandbox server (own port; state dir kept between runs so the image is
built once), runs every benchmark with its baseline interleaved, prints a table and writes
bench/results/latest.json plus a timestamped copy. Nothing here asserts a time: the
numbers are reported, with the target each one is meant to meet.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import shutil
import sys
import time
import typing as t

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    __package__ = "bench"

from bench import harness  # noqa: E402
from bench.harness import (  # noqa: E402
    DEFAULT_STATE_DIR,
    BenchServer,
    fmt,
    markdown_table,
    result_rows,
    run_section,
)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

BENCHMARKS = ["trivial_cell", "first_result", "create", "followup", "files", "density", "concurrency", "load", "edge",
              "big_print"]
# As in README.md (9 is bench.gvisor_bench, a script of its own).
NUMBER = dict(zip(BENCHMARKS, ["1", "2", "3", "4", "5", "6a", "6b", "7", "8", "10"]))

FULL = {
    "trivial_cell": {"reps": 200, "warmup": 20},
    "first_result": {"reps": 8},
    "create": {"reps": 20},
    "followup": {"stateful_reps": 20, "stateless_reps": 5, "fresh_sandbox_reps": 3},
    "files": {"reps": 5},
    "density": {"n": 10},
    "concurrency": {"levels": [1, 10, 50], "cells": 40, "rounds": 4},
    "load": {"n": 50, "cells": 100},
    "edge": {"reps": 2},
    "big_print": {"reps": 5},
}
QUICK = {
    "trivial_cell": {"reps": 30, "warmup": 5},
    "first_result": {"reps": 2},
    "create": {"reps": 2},
    "followup": {"stateful_reps": 6, "stateless_reps": 2, "fresh_sandbox_reps": 1},
    "files": {"reps": 2},
    "density": {"n": 4},
    "concurrency": {"levels": [1, 5, 10], "cells": 10, "rounds": 2},
    "load": {"n": 10, "cells": 20},
    "edge": {"reps": 2},  # the worse of two: one run of a flood is too noisy to report
    "big_print": {"reps": 2},
}


def machine() -> dict[str, t.Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(mem_kb / 1024 / 1024, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "os": _os_release()}


def _os_release() -> str:
    try:
        with open("/etc/os-release") as f:
            return next((line.split("=", 1)[1].strip().strip('"') for line in f if line.startswith("PRETTY_NAME")), "")
    except OSError:
        return ""


def table(results: dict[str, dict[str, t.Any]]) -> str:
    head = ("#", "benchmark", "stat", "ours", "baseline", "ratio", "target", "met")
    rows = []
    for name in BENCHMARKS:
        i = NUMBER[name]
        r = results.get(name)
        if r is None:
            continue
        if r.get("status") != "ok":
            rows.append((i, name, "", "", "", "", "", r.get("status", "")[:70]))
            continue
        for j, row in enumerate(result_rows(r)):
            met = fmt(r.get("meets_target")) if j == 0 and r.get("meets_target") is not None else ""
            rows.append((i if j == 0 else "", *row, met))
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small repetition counts (a smoke test, ~2 min)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only these: {', '.join(BENCHMARKS)}")
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", DEFAULT_STATE_DIR),
                        help="server state dir, kept so the image is built once (default %(default)s)")
    parser.add_argument("--out", default=str(RESULTS / "latest.json"), help="JSON results (default %(default)s)")
    args = parser.parse_args(argv)

    params = QUICK if args.quick else FULL
    selected = args.only or BENCHMARKS
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = dt.datetime.now(dt.timezone.utc)
    t_start = time.monotonic()
    results: dict[str, dict[str, t.Any]] = {}
    doc: dict[str, t.Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
        "mode": "quick" if args.quick else "full", "params": {k: params[k] for k in selected},
        "machine": machine(), "host_load_at_start": {"loadavg": harness.loadavg(),
                                                     "foreign_processes": harness.foreign_test_processes()},
        "results": results,
    }

    log(f"starting a sandbox server (state dir {args.state_dir})")
    server = BenchServer(args.state_dir, pool_size=2, log=log)
    server.start()
    log(f"  server pid {server.pid} on {server.url}")
    from bench import edge_bench, kernel_bench, load_bench, service_bench

    setup = kernel_bench.KernelSetup(server)
    kernel_status: str | None = None
    if {"trivial_cell", "first_result", "big_print"} & set(selected):
        kernel_status = setup.check()
        log(f"  kernel: {kernel_status or 'available'}")
        server.wait_pool()
    doc["kernel"] = kernel_status or "available"
    fleet = load_bench.Fleet(server)
    single_p50: float | None = None

    def run(name: str, fn: t.Callable[[], dict[str, t.Any]]) -> None:
        if name not in selected:
            return
        log(f"[{name}] {params[name]}")
        r = run_section(fn, log)
        if r["status"] != "ok":
            log(server.log_tail(15))
        r["params"] = params[name]
        results[name] = r
        log(f"[{name}] {r['status']} in {r['host_load']['seconds']} s (load avg {r['host_load']['loadavg_end'][0]})")
        try:
            server.wait_pool()
        except Exception as exc:
            log(f"  pool did not refill: {exc}")

    try:
        for name in ("trivial_cell", "first_result", "big_print"):
            if name in selected and kernel_status:
                results[name] = {"status": kernel_status, "params": params[name]}
        if not kernel_status:
            run("trivial_cell", lambda: kernel_bench.bench_trivial_cell(server, setup, **params["trivial_cell"]))
            run("first_result", lambda: kernel_bench.bench_first_result(server, setup, **params["first_result"]))
            run("big_print", lambda: kernel_bench.bench_big_print(server, setup, **params["big_print"]))
        run("create", lambda: service_bench.bench_create(server, **params["create"]))
        run("followup", lambda: service_bench.bench_followup(server, **params["followup"]))
        run("files", lambda: service_bench.bench_files(server, **params["files"]))
        run("density", lambda: load_bench.bench_density(server, fleet, params["density"]["n"], setup))

        def conc() -> dict[str, t.Any]:
            nonlocal single_p50
            r = load_bench.bench_concurrency(server, fleet, **params["concurrency"])
            single_p50 = r["metrics"][f"latency_ms_{params['concurrency']['levels'][0]}"].get("p50")
            return r

        run("concurrency", conc)
        run("load", lambda: load_bench.bench_load(server, fleet, single_p50_ms=single_p50, **params["load"]))
        run("edge", lambda: edge_bench.bench_edge(server, **params["edge"]))
    finally:
        log("stopping: deleting sandboxes, stopping the server")
        try:
            fleet.close()
        finally:
            server.stop()
            shutil.rmtree(setup.prefix, ignore_errors=True)

    # sandboxes the server did not delete on shutdown (a server bug: pooled ones), ended by us
    doc["sandboxes_left_running_by_server"] = server.leftovers
    doc["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    doc["seconds"] = round(time.monotonic() - t_start, 1)
    doc["host_load_at_end"] = {"loadavg": harness.loadavg(), "foreign_processes": harness.foreign_test_processes()}
    doc["table"] = table(results)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1, default=str)
    out.write_text(text + "\n")
    if out.resolve() == (RESULTS / "latest.json").resolve():
        (RESULTS / f"{started.strftime('%Y%m%dT%H%M%SZ')}{'-quick' if args.quick else ''}.json").write_text(text + "\n")
    print(doc["table"])
    for name in BENCHMARKS:
        for note in (results.get(name) or {}).get("notes", []):
            print(f"note ({NUMBER[name]} {name}): {note}")
    print(f"\n{doc['mode']} run, {doc['seconds']} s; load average at start {doc['host_load_at_start']['loadavg']}, "
          f"at end {doc['host_load_at_end']['loadavg']}; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
