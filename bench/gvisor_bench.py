"""Benchmark 9: the gVisor tier beside the bwrap tier, and pause/resume of gVisor sandboxes.

`python -m bench.gvisor_bench [--state-dir DIR] [--reps N] [--sizes 100,300] [--rounds 3]`

One server of its own (no warm pool, so both tiers pay a cold create), both tiers measured
in the same run, alternately:

- create: POST /v1/sandboxes until the sandbox answers, bwrap vs gvisor (cold: no pool);
- trivial cell: `1` executed on a running sandbox, p50 per tier, and their ratio;
- sleep at its floor, per state size: a gvisor sandbox holding N MB of random
  (incompressible) bytes objects beside numpy, pandas and IPython, in ``--rounds`` rounds
  each of: pause (`POST .../pause`: runsc checkpoint, the process ends), a fork of the
  paused sandbox (until the fork answers), resume (`POST .../resume`: a new supervisor,
  runsc restore, a ping); and, alternating with them, a bare runsc checkpoint and restore
  (to its first answer) of a container holding the same state (``bench/runsc_bare.py``),
  placed in the host's group, beside the sandboxes, and beside them under a 1-CPU quota;
  the p50 of each, the ratio to the floor (target: at most 1.25x), every fork's and
  resume's state checked;
- the timeline of each of ours (the answer's `timeline`: the steps the server, the
  supervisor and runsc took), medians over the rounds, beside the bare container's steps.

Nothing is asserted; the numbers go to stdout as tables and to bench/results/gvisor.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from bench import runsc_bare
from bench.harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, create, delete, execute, markdown_table, server_settings

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def p50(values):
    return statistics.median(values) if values else None


def run(state_dir: str, reps: int, sizes: list[int], rounds: int = 3, settings: tuple[str, ...] = ()) -> dict:
    server = BenchServer(state_dir, pool_size=0, extra_args=server_settings(settings))
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
                out["pause"].append(measure_state(c, server, mb, rounds))
    finally:
        server.stop()
    out["host_load"] = load.finish()
    return out


def holds(c, sid: str, mb: int) -> bool:
    check = execute(c, sid, "sum(len(b) for b in blobs) >> 20")
    return any(e.get("type") == "execute_result" and e["data"]["text/plain"] == str(mb) for e in check)


def steps(answer: dict) -> list:
    return (answer.get("timeline") or {}).get("steps", [])


def median_steps(timelines: list[list]) -> list:
    """Each step's median over the rounds, in the order of the first round's steps."""
    names = [name for name, _ in timelines[0]] if timelines else []
    return [[name, round(p50([dict(t).get(name, 0.0) for t in timelines]), 3)] for name in names]


# The same state in the sandbox and in the bare container: an interpreter holding numpy,
# pandas and IPython (the sandbox's runtime is IPython) and ``mb`` MB of random bytes.
HELD_MODULES = ["numpy", "pandas", "IPython"]


def measure_state(c, server: BenchServer, mb: int, rounds: int) -> dict:
    """``rounds`` rounds, each: our pause, a fork of the paused sandbox, our resume (to its
    answer), and a bare runsc checkpoint and restore of the same state (the floor), the two
    in alternating order. Each of ours carries the server's timeline of its steps."""
    sid = create(c, isolation="gvisor", memory_mb=max(1024, mb * 3 + 512))["id"]
    execute(c, sid, f"import numpy, pandas, os; blobs = [os.urandom(1 << 20) for i in range({mb})]")  # incompressible
    bundle = json.loads((server.sandbox_dir(sid) / "bundle" / "config.json").read_text())
    before = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
    ours = {"pause": [], "paused_fork": [], "resume": []}
    timelines: dict[str, list] = {k: [] for k in ours}
    bare: dict[str, list[dict]] = {placement: [] for placement in runsc_bare.PLACEMENTS}
    checks = []
    checkpoint: dict = {}
    for i in range(rounds):
        def our_round():
            nonlocal checkpoint
            seconds, paused = timed(lambda: c.post(f"/v1/sandboxes/{sid}/pause").json())
            ours["pause"].append(seconds)
            timelines["pause"].append(steps(paused))
            checkpoint = paused.get("checkpoint") or checkpoint
            seconds, fork = timed(lambda: c.post(f"/v1/sandboxes/{sid}/fork", json={}).json())
            ours["paused_fork"].append(seconds)
            timelines["paused_fork"].append(steps(fork))
            checks.append(holds(c, fork["id"], mb))
            delete(c, fork["id"])
            seconds, resumed = timed(lambda: c.post(f"/v1/sandboxes/{sid}/resume").json())
            ours["resume"].append(seconds)
            timelines["resume"].append(steps(resumed))
            checks.append(holds(c, sid, mb))

        def bare_round():
            for placement, runs in bare.items():
                runs.append(runsc_bare.checkpoint_restore(bundle, mb, HELD_MODULES, str(server.state_dir), placement))

        for part in ((our_round, bare_round) if i % 2 == 0 else (bare_round, our_round)):
            part()
    after = c.get(f"/v1/sandboxes/{sid}").json().get("memory_bytes")
    delete(c, sid)
    floors = {placement: {"pause": p50([b["pause_s"] for b in runs]),
                          "restore": p50([b["restore_to_answer_s"] for b in runs])} for placement, runs in bare.items()}
    floor = floors["host"]
    row = {"state_mb": mb, "rounds": rounds, "state_intact": all(checks),
           "checkpoint_mb": round(checkpoint.get("size_bytes", 0) / 1e6, 1),
           "memory_before_mb": round((before or 0) / 1e6, 1), "memory_after_resume_mb": round((after or 0) / 1e6, 1),
           "bare_runsc": bare, "bare_image_mb": bare["host"][0]["image_mb"] if rounds else None,
           "bare_pause_s": floor["pause"], "bare_restore_to_answer_s": floor["restore"], "bare_by_placement": floors,
           "bare_steps": {placement: [[k, p50([b[k] for b in runs])] for k in
                                      ("checkpoint_s", "container_exit_s", "restore_to_answer_s")]
                          for placement, runs in bare.items()},
           "timelines": {k: median_steps(v) for k, v in timelines.items()}}
    for name, samples in ours.items():
        row[f"{name}_s"] = round(p50(samples), 3)
        row[f"{name}_samples"] = [round(s, 3) for s in samples]
        kind = "pause" if name == "pause" else "restore"
        row[f"{name}_ratio"] = round(p50(samples) / floor[kind], 2)
        row[f"{name}_ratio_beside"] = round(p50(samples) / floors["beside"][kind], 2)
    return row


def print_timelines(rows: list[dict]) -> None:
    for row in rows:
        for name, timeline in row["timelines"].items():
            print(f"\n{name}, {row['state_mb']} MB (median of {row['rounds']}):")
            print(markdown_table(["step", "s"], [[step, f"{s:.3f}"] for step, s in timeline]))
        for placement, bare_steps in row["bare_steps"].items():
            print(f"\nbare runsc ({placement}), {row['state_mb']} MB (median of {row['rounds']}):")
            print(markdown_table(["step", "s"], [[step, f"{s:.3f}"] for step, s in bare_steps]))


def print_floor(rows: list[dict]) -> None:
    """Ours against the floor measured in the same run (target: at most 1.25x), and against
    the same bare container placed beside the sandboxes, without and with their quota."""
    lines = []
    for row in rows:
        for name, kind, what in (("pause", "pause", "checkpoint + exit"), ("resume", "restore", "restore to answer"),
                                 ("paused_fork", "restore", "restore to answer")):
            floors = row["bare_by_placement"]
            ratio = row[f"{name}_ratio"]
            lines.append([f"{name}, {row['state_mb']} MB", f"{row[f'{name}_s']:.2f}",
                          f"{floors['host'][kind]:.2f} ({what})", f"{ratio:.2f}x", "yes" if ratio <= 1.25 else "no",
                          f"{floors['beside'][kind]:.2f}", f"{row[f'{name}_ratio_beside']:.2f}x",
                          f"{floors['beside_quota'][kind]:.2f}"])
    print(markdown_table(["", "ours, s (p50)", "bare runsc, s (p50)", "ratio", "<= 1.25x",
                          "bare beside sandboxes, s", "ratio", "bare beside, 1-CPU quota, s"], lines))
    print()


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
    parser.add_argument("--rounds", type=int, default=3, help="pause/fork/resume rounds per size, each beside a bare one")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting (e.g. supervisor_template=false, for the run before a change)")
    args = parser.parse_args()
    result = run(args.state_dir, args.reps, [int(s) for s in args.sizes.split(",")], args.rounds, tuple(args.set))
    result["server_settings"] = args.set
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gvisor.json").write_text(json.dumps(result, indent=1))
    if args.reps:
        print_tiers(result)
    print_floor(result["pause"])
    keys = ["state_mb", "checkpoint_mb", "bare_image_mb", "memory_before_mb", "memory_after_resume_mb", "state_intact"]
    print(markdown_table(keys, [[str(row[k]) for k in keys] for row in result["pause"]]))
    print_timelines(result["pause"])
    print("\nhost load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
