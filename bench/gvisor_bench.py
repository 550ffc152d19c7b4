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
  answers, then again once the source is paused (no checkpoint, one restore); each fork's
  state is checked;
- the timeline of each (the sandbox object's `timeline`: the steps the server, the
  supervisor and runsc took), and beside them a bare `runsc checkpoint` and `runsc restore`
  of a container holding the same state (``bench/runsc_bare.py``): gVisor's own share.

Nothing is asserted; the numbers go to stdout as a table and to bench/results/gvisor.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from bench import runsc_bare
from bench.harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, create, delete, execute, markdown_table

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
    load = HostLoad()
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
            if reps:
                out["create_ratio"] = out["create_s"]["gvisor"] / out["create_s"]["bwrap"]
                out["trivial_cell_ratio"] = out["trivial_cell_ms"]["gvisor"] / out["trivial_cell_ms"]["bwrap"]
            for mb in sizes:
                out["pause"].append(measure_state(c, server, mb))
    finally:
        server.stop()
    out["host_load"] = load.finish()
    return out


def holds(c, sid: str, mb: int) -> bool:
    check = execute(c, sid, "sum(len(b) for b in blobs) >> 20")
    return any(e.get("type") == "execute_result" and e["data"]["text/plain"] == str(mb) for e in check)


def steps(answer: dict) -> list:
    return (answer.get("timeline") or {}).get("steps", [])


def measure_state(c, server: BenchServer, mb: int) -> dict:
    """Pause, resume, fork (running, then paused) of one sandbox holding ``mb`` MB, each with
    the server's timeline of its steps; then a bare runsc checkpoint/restore of the same size."""
    sid = create(c, isolation="gvisor", memory_mb=max(1024, mb * 3 + 512))["id"]
    execute(c, sid, f"import os; blobs = [os.urandom(1 << 20) for i in range({mb})]")  # incompressible
    bundle = json.loads((server.sandbox_dir(sid) / "bundle" / "config.json").read_text())
    preloaded = json.loads((server.sandbox_dir(sid) / "state.json").read_text())["runtime"]["preloaded"]
    before = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
    pause_s, paused = timed(lambda: c.post(f"/v1/sandboxes/{sid}/pause").json())
    resume_s, resumed = timed(lambda: c.post(f"/v1/sandboxes/{sid}/resume").json())
    after = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
    intact = holds(c, sid, mb)
    fork_s, forked = timed(lambda: c.post(f"/v1/sandboxes/{sid}/fork", json={}).json())
    fork_intact = holds(c, forked["id"], mb)
    delete(c, forked["id"])
    c.post(f"/v1/sandboxes/{sid}/pause").raise_for_status()
    paused_fork_s, paused_fork = timed(lambda: c.post(f"/v1/sandboxes/{sid}/fork", json={}).json())
    paused_fork_intact = holds(c, paused_fork["id"], mb)
    delete(c, paused_fork["id"])
    delete(c, sid)
    bare = runsc_bare.checkpoint_restore(bundle, mb, preloaded, str(server.state_dir))
    cp = paused.get("checkpoint") or {}
    per100 = 100 / mb
    return {
        "state_mb": mb, "pause_s": round(pause_s, 2), "resume_s": round(resume_s, 2),
        "pause_s_per_100mb": round(pause_s * per100, 2), "resume_s_per_100mb": round(resume_s * per100, 2),
        "checkpoint_mb": round(cp.get("size_bytes", 0) / 1e6, 1), "checkpoint_s": cp.get("seconds"),
        "memory_before_mb": round((before or 0) / 1e6, 1), "memory_after_resume_mb": round((after or 0) / 1e6, 1),
        "state_intact": intact, "resumed_state": resumed.get("state"),
        "fork_s": round(fork_s, 2), "fork_s_per_100mb": round(fork_s * per100, 2), "fork_intact": fork_intact,
        "paused_fork_s": round(paused_fork_s, 2), "paused_fork_s_per_100mb": round(paused_fork_s * per100, 2),
        "paused_fork_intact": paused_fork_intact,
        "bare_runsc": bare,
        "bare_checkpoint_s_per_100mb": round(bare["checkpoint_s"] * per100, 2),
        "bare_restore_s_per_100mb": round(bare["restore_s"] * per100, 2),
        "timelines": {"pause": steps(paused), "resume": steps(resumed), "fork_running": steps(forked),
                      "fork_paused": steps(paused_fork)},
    }


def print_timelines(rows: list[dict]) -> None:
    for row in rows:
        for name, timeline in row["timelines"].items():
            print(f"\n{name}, {row['state_mb']} MB:")
            print(markdown_table(["step", "s"], [[step, f"{s:.3f}"] for step, s in timeline]))


def print_tiers(result: dict) -> None:
    print(markdown_table(["", "bwrap", "gvisor", "gvisor / bwrap"], [
        ["create (cold, no pool), s", f"{result['create_s']['bwrap']:.2f}", f"{result['create_s']['gvisor']:.2f}",
         f"{result['create_ratio']:.1f}x"],
        ["trivial cell p50, ms", f"{result['trivial_cell_ms']['bwrap']:.1f}", f"{result['trivial_cell_ms']['gvisor']:.1f}",
         f"{result['trivial_cell_ratio']:.1f}x"],
    ]))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gvisor_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--sizes", default="100,300")
    args = parser.parse_args()
    result = run(args.state_dir, args.reps, [int(s) for s in args.sizes.split(",")])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gvisor.json").write_text(json.dumps(result, indent=1))
    if args.reps:
        print_tiers(result)
    keys = ["state_mb", "pause_s_per_100mb", "bare_checkpoint_s_per_100mb", "resume_s_per_100mb",
            "bare_restore_s_per_100mb", "checkpoint_mb", "memory_before_mb", "memory_after_resume_mb",
            "state_intact", "fork_s_per_100mb", "fork_intact", "paused_fork_s_per_100mb", "paused_fork_intact"]
    print(markdown_table(keys, [[str(row[k]) for k in keys] for row in result["pause"]]))
    print_timelines(result["pause"])
    print("\nhost load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
