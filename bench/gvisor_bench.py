"""Benchmark 9: the gVisor tier beside the bwrap tier, and pause/resume of gVisor sandboxes.

`python -m bench.gvisor_bench [--state-dir DIR] [--reps N] [--sizes 100,300]`

One server of its own (no warm pool, so both tiers pay a cold create), both tiers measured
in the same run, alternately:

- create: POST /v1/sandboxes until the sandbox answers, bwrap vs gvisor (cold: no pool);
- trivial cell: `1` executed on a running sandbox, p50 per tier, and their ratio;
- pause/resume per 100 MB of interpreter state: a gvisor sandbox holding N MB of bytes
  random (incompressible) bytes objects is paused (`POST .../pause`: runsc checkpoint, the process ends) and resumed
  (`POST .../resume`: a new supervisor, runsc restore, a ping); the time of each, the
  checkpoint's size, and the sandbox cgroup's memory before the pause and after the resume;
- fork per 100 MB: the same running sandbox forked (`POST .../fork`: its checkpoint, the
  workspace copied, then the source and the fork restored side by side), until the fork
  answers; the fork's state is checked.

Nothing is asserted; the numbers go to stdout as a table and to bench/results/gvisor.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from bench.harness import DEFAULT_STATE_DIR, BenchServer, create, delete, execute, markdown_table

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def p50(values):
    return statistics.median(values) if values else None


def run(state_dir: str, reps: int, sizes: list[int]) -> dict:
    server = BenchServer(state_dir, pool_size=0)
    server.start()
    out: dict = {"create_s": {}, "trivial_cell_ms": {}, "pause": []}
    try:
        with server.client(timeout=900) as c:
            creates = {"bwrap": [], "gvisor": []}
            cells = {"bwrap": [], "gvisor": []}
            for i in range(reps):
                for tier in (("bwrap", "gvisor") if i % 2 == 0 else ("gvisor", "bwrap")):
                    seconds, info = timed(lambda: create(c, isolation=tier))
                    creates[tier].append(seconds)
                    sid = info["id"]
                    execute(c, sid, "1")  # warm-up
                    for _ in range(20):
                        cells[tier].append(timed(lambda: execute(c, sid, "1"))[0] * 1000)
                    delete(c, sid)
            for tier in creates:
                out["create_s"][tier] = p50(creates[tier])
                out["trivial_cell_ms"][tier] = p50(cells[tier])
            out["create_ratio"] = out["create_s"]["gvisor"] / out["create_s"]["bwrap"]
            out["trivial_cell_ratio"] = out["trivial_cell_ms"]["gvisor"] / out["trivial_cell_ms"]["bwrap"]
            for mb in sizes:
                sid = create(c, isolation="gvisor", memory_mb=max(1024, mb * 3 + 512))["id"]
                execute(c, sid, f"import os; blobs = [os.urandom(1 << 20) for i in range({mb})]")  # incompressible
                before = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
                pause_s, paused = timed(lambda: c.post(f"/v1/sandboxes/{sid}/pause").json())
                resume_s, resumed = timed(lambda: c.post(f"/v1/sandboxes/{sid}/resume").json())
                after = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
                check = execute(c, sid, "sum(len(b) for b in blobs) >> 20")
                intact = any(e.get("type") == "execute_result" and e["data"]["text/plain"] == str(mb) for e in check)
                fork_s, forked = timed(lambda: c.post(f"/v1/sandboxes/{sid}/fork", json={}).json())
                fork_check = execute(c, forked["id"], "sum(len(b) for b in blobs) >> 20")
                fork_intact = any(e.get("type") == "execute_result" and e["data"]["text/plain"] == str(mb)
                                  for e in fork_check)
                delete(c, forked["id"])
                cp = paused.get("checkpoint") or {}
                out["pause"].append({
                    "state_mb": mb, "pause_s": round(pause_s, 2), "resume_s": round(resume_s, 2),
                    "pause_s_per_100mb": round(pause_s * 100 / mb, 2), "resume_s_per_100mb": round(resume_s * 100 / mb, 2),
                    "checkpoint_mb": round(cp.get("size_bytes", 0) / 1e6, 1), "checkpoint_s": cp.get("seconds"),
                    "memory_before_mb": round((before or 0) / 1e6, 1), "memory_after_resume_mb": round((after or 0) / 1e6, 1),
                    "state_intact": intact, "resumed_state": resumed.get("state"),
                    "fork_s": round(fork_s, 2), "fork_s_per_100mb": round(fork_s * 100 / mb, 2),
                    "fork_intact": fork_intact,
                })
                delete(c, sid)
    finally:
        server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gvisor_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--sizes", default="100,300")
    args = parser.parse_args()
    result = run(args.state_dir, args.reps, [int(s) for s in args.sizes.split(",")])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gvisor.json").write_text(json.dumps(result, indent=1))
    print(markdown_table(["", "bwrap", "gvisor", "gvisor / bwrap"], [
        ["create (cold, no pool), s", f"{result['create_s']['bwrap']:.2f}", f"{result['create_s']['gvisor']:.2f}",
         f"{result['create_ratio']:.1f}x"],
        ["trivial cell p50, ms", f"{result['trivial_cell_ms']['bwrap']:.1f}", f"{result['trivial_cell_ms']['gvisor']:.1f}",
         f"{result['trivial_cell_ratio']:.1f}x"],
    ]))
    print()
    keys = ["state_mb", "pause_s", "resume_s", "pause_s_per_100mb", "resume_s_per_100mb", "checkpoint_mb",
            "memory_before_mb", "memory_after_resume_mb", "state_intact", "fork_s_per_100mb", "fork_intact"]
    print(markdown_table(keys, [[str(row[k]) for k in keys] for row in result["pause"]]))


if __name__ == "__main__":
    main()
