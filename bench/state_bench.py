"""Benchmark 11, state by value: save and restore a 100 MB DataFrame, against pickle's own speed.

`python -m bench.state_bench [--state-dir DIR] [--mb 100] [--runs 3]`

One server of its own (no warm pool), one bubblewrap sandbox holding a DataFrame of `--mb`
MB of float64. In the same sandbox, in the same run (so the same disk and the same load):

- `pickle`: the standard pickler, protocol 5 in-band, to a file in /workspace (fsync'd) and back;
- `cloudpickle in-band`: what a save would cost without out-of-band buffers;
- `runtime save/restore`: the runtime's own (sandbox_runtime/saving.py: cloudpickle with the
  frame's buffers written raw after the stream), to /workspace and back;
- `dill` and `parquet` (pyarrow) when the image has them (the default image has neither);

and through the API, end to end: `POST /save` (the runtime's save plus the server's copy
into its store), `POST /restore` into a running sandbox (the copy into its workspace plus
the load), and `POST /v1/sandboxes {from_save}` (a create plus that restore).

Each figure is the median of `--runs` (each run takes the ways in another order); the numbers go to stdout and bench/results/state.json.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from bench.harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, create, delete, execute, markdown_table

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

FRAME = """
import numpy as np, pandas as pd
df = pd.DataFrame(np.random.default_rng(1).standard_normal(({rows}, 10)), columns=[f"c{{i}}" for i in range(10)])
"""

# Runs in the sandbox: each way of writing df to /workspace and reading it back, timed.
IN_SANDBOX = r"""
import json, os, pickle, time, types
import cloudpickle
import sandbox_runtime.saving as saving

def fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # this file's data on disk (os.sync would wait for every writer on the host)
    finally:
        os.close(fd)

def timed(write, read, path):
    t0 = time.perf_counter(); write(path); fsync(path); t1 = time.perf_counter()
    back = read(path); t2 = time.perf_counter()
    assert back.shape == df.shape
    size = os.path.getsize(path); os.unlink(path)
    return {"save_s": round(t1 - t0, 3), "restore_s": round(t2 - t1, 3), "bytes": size}

def dump_with(module):
    def write(path):
        with open(path, "wb") as f:
            module.dump(df, f, protocol=5)
    return write

def load_with(module):
    def read(path):
        with open(path, "rb") as f:
            return module.load(f)
    return read

shell = types.SimpleNamespace(user_ns={"df": df}, user_ns_hidden={})
def runtime_write(path):
    saving.save(shell, path, 1 << 40, 600)
def runtime_read(path):
    target = types.SimpleNamespace(user_ns={}, user_ns_hidden={})
    saving.restore(target, path)
    return target.user_ns["df"]

ways = [("pickle", dump_with(pickle), load_with(pickle)),
        ("cloudpickle in-band", dump_with(cloudpickle), load_with(pickle)),
        ("runtime save/restore", runtime_write, runtime_read)]
ways = ways[RUN % 3:] + ways[:RUN % 3]  # each run in another order: no way always goes first
found = {name: timed(write, read, f"/workspace/b.{index}") for index, (name, write, read) in enumerate(ways)}
try:
    import dill
    found["dill"] = timed(dump_with(dill), load_with(dill), "/workspace/b.dill")
except ImportError:
    pass
try:
    import pyarrow  # noqa: F401
    found["parquet"] = timed(lambda p: df.to_parquet(p), lambda p: pd.read_parquet(p), "/workspace/b.parquet")
except ImportError:
    pass
print(json.dumps(found))
"""


def _stdout(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e.get("type") == "stream" and e.get("name") == "stdout")


def _timed_post(c, path: str, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = c.post(path, json=body)
    took = time.perf_counter() - t0
    if r.status_code not in (200, 201):
        raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:300]}")
    return took, r.json()


def run(state_dir: str, mb: int, runs: int) -> dict:
    rows = mb * 1_000_000 // 80
    server = BenchServer(state_dir, pool_size=0)
    server.start()
    load = HostLoad()
    inside: list[dict] = []
    api: dict[str, list[float]] = {"api save": [], "api restore": [], "api create from_save": []}
    try:
        with server.client(timeout=900) as c:
            sid = create(c, memory_mb=3072, disk_mb=4096)["id"]
            target = create(c, memory_mb=3072, disk_mb=4096)["id"]
            execute(c, sid, FRAME.format(rows=rows))
            for _ in range(runs):
                code = f"RUN = {len(inside)}\n" + IN_SANDBOX
                inside.append(json.loads(_stdout(execute(c, sid, code)).strip().splitlines()[-1]))
                took, save = _timed_post(c, f"/v1/sandboxes/{sid}/save", {"label": "bench"})
                api["api save"].append(took)
                took, restored = _timed_post(c, f"/v1/sandboxes/{target}/restore", {"save_id": save["id"]})
                api["api restore"].append(took)
                assert "error" not in restored, restored
                took, made = _timed_post(c, "/v1/sandboxes", {"from_save": save["id"], "memory_mb": 3072,
                                                              "disk_mb": 4096})
                api["api create from_save"].append(took)
                delete(c, made["id"])
                c.delete(f"/v1/saves/{save['id']}")
            save_bytes = save["bytes"]
            delete(c, sid)
            delete(c, target)
    finally:
        server.stop()
    ways = {}
    for name in inside[0]:
        ways[name] = {k: statistics.median(run[name][k] for run in inside) for k in ("save_s", "restore_s", "bytes")}
    base = ways["pickle"]
    for way in ways.values():
        way["save_vs_pickle"] = round(way["save_s"] / base["save_s"], 2)
        way["restore_vs_pickle"] = round(way["restore_s"] / base["restore_s"], 2)
    return {"frame_mb": mb, "runs": runs, "in_sandbox": ways,
            "api": {k: round(statistics.median(v), 3) for k, v in api.items()}, "save_bytes": save_bytes,
            "host_load": load.finish()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.state_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    result = run(args.state_dir, args.mb, args.runs)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "state.json").write_text(json.dumps(result, indent=1))
    per = 100 / result["frame_mb"]
    print(markdown_table(["in the sandbox", "save s/100 MB", "restore s/100 MB", "x pickle (save, restore)", "MB"],
                         [[name, round(w["save_s"] * per, 2), round(w["restore_s"] * per, 2),
                           f"{w['save_vs_pickle']}, {w['restore_vs_pickle']}", round(w["bytes"] / 1e6, 1)]
                          for name, w in result["in_sandbox"].items()]))
    print(markdown_table(["through the API", "s/100 MB"],
                         [[name, round(s * per, 2)] for name, s in result["api"].items()]))
    print("\nhost load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
