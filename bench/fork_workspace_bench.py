"""Benchmark 9, a fork's workspace: copied versus shared through the workspace store.

`python -m bench.fork_workspace_bench [--state-dir DIR] [--sizes 200,600] [--reps 2]`

A fork of a gVisor sandbox gets a workspace of its own that starts as its source's. Two
servers on the same state directory, one after the other (the image is built once): one
with the workspace store off (`--set workspace_store=False`: the image file is copied,
sparse) and one with it on (the default: a reflink in the XFS store). For each, a gVisor
sandbox writes N MB of random bytes to its workspace and is paused; then it is forked
`--reps` times, each fork timed until it answers, with the fork's `lay_out.copy_workspace` step
(the copy itself), the host disk the fork added (the state directory's filesystem, which
holds the store's file too), and whether the fork reads the same bytes.

Nothing is asserted; the numbers go to stdout and to bench/results/fork_workspace.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

from bench.harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, create, delete, execute, markdown_table

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
WRITE = ("import hashlib, os\nh = hashlib.sha256()\nwith open('data.bin', 'wb') as f:\n"
         "    for _ in range({mb}):\n        b = os.urandom(1 << 20); h.update(b); f.write(b)\nprint(h.hexdigest())")
READ = ("import hashlib\nh = hashlib.sha256()\nwith open('data.bin', 'rb') as f:\n"
        "    for b in iter(lambda: f.read(1 << 20), b''): h.update(b)\nprint(h.hexdigest())")


def text(events: list[dict]) -> str:
    return "".join(e.get("text", "") for e in events if e.get("type") == "stream").strip()


def host_used(path: pathlib.Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def measure(server: BenchServer, mb: int, reps: int) -> dict:
    with server.client(timeout=900) as c:
        sid = create(c, isolation="gvisor", disk_mb=max(1024, mb * 2))["id"]
        digest = text(execute(c, sid, WRITE.format(mb=mb)))
        disk = c.get(f"/v1/sandboxes/{sid}").json()["isolation"]["disk"]
        c.post(f"/v1/sandboxes/{sid}/pause").raise_for_status()
        seconds, copies, added, intact = [], [], [], []
        for _ in range(reps):
            before = host_used(server.state_dir)
            t0 = time.perf_counter()
            r = c.post(f"/v1/sandboxes/{sid}/fork", json={})
            seconds.append(time.perf_counter() - t0)
            if r.status_code != 201:
                raise RuntimeError(f"fork answered {r.status_code}: {r.text[:300]}")
            fork = r.json()
            added.append((host_used(server.state_dir) - before) / 1e6)
            steps = dict((fork.get("timeline") or {}).get("steps", []))
            copies.append(steps.get("lay_out.copy_workspace", float("nan")))
            intact.append(text(execute(c, fork["id"], READ)) == digest)
            delete(c, fork["id"])
        delete(c, sid)
    return {"workspace_mb": mb, "disk": disk, "fork_paused_s": round(statistics.median(seconds), 3),
            "workspace_copy_s": round(statistics.median(copies), 4),
            "host_disk_added_mb": round(statistics.median(added), 1), "fork_intact": all(intact)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fork_workspace_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--sizes", default="200,600")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    load = HostLoad()
    rows = []
    for store in (False, True):
        server = BenchServer(args.state_dir, pool_size=0, extra_args=("--set", f"workspace_store={store}"))
        server.start()
        try:
            for mb in (int(s) for s in args.sizes.split(",")):
                rows.append({"store": store, **measure(server, mb, args.reps)})
        finally:
            server.stop()
    result = {"rows": rows, "host_load": load.finish()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fork_workspace.json").write_text(json.dumps(result, indent=1))
    keys = ["store", "workspace_mb", "fork_paused_s", "workspace_copy_s", "host_disk_added_mb", "fork_intact"]
    print(markdown_table(keys, [[str(row[k]) for k in keys] for row in rows]))
    print("\nhost load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
