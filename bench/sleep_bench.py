"""Benchmark 9, sleep-after: idle gVisor sandboxes asleep on disk versus live in memory.

`python -m bench.sleep_bench [--state-dir DIR] [--count 3] [--mb 200] [--sleep-after 5]`

One server of its own (no warm pool) with `--set gvisor_sleep_after_seconds=S`. N gVisor
sandboxes each fill `--mb` MB of random (incompressible) bytes, then idle:

- live: the sum of their cgroups' memory (`memory_bytes` of each sandbox object: gVisor's
  Sentry, gofer and the code) and the host's MemAvailable, before the sandboxes and with them;
- asleep: once the sleeper paused every one (`paused_by: "idle"`), the host's MemAvailable
  again (the memory given back), their checkpoints' size and the disk their checkpoint
  directories take (allocated blocks);
- the wake: one execute per sandbox that reads its bytes back, timed, with the note it began
  with (the kernel's first line), and whether the bytes are intact;
- what this host holds: its MemAvailable before the benchmark over one live sandbox's memory,
  against the free disk of the state directory over one sleeping sandbox's checkpoint.

Nothing is asserted; the numbers go to stdout and to bench/results/sleep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

from bench.harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, create, delete, execute, markdown_table

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MB = 1e6


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def allocated(path: pathlib.Path) -> int:
    """Bytes of disk a tree takes (its files' allocated blocks, as du counts them)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def wait_all_asleep(c, sids: list[str], timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        views = [c.get(f"/v1/sandboxes/{sid}").json() for sid in sids]
        if all(v.get("state") == "paused" and v.get("paused_by") == "idle" for v in views):
            return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"not all asleep after {timeout:.0f} s: {[v.get('state') for v in views]}")


def run(state_dir: str, count: int, mb: int, sleep_after: int) -> dict:
    server = BenchServer(state_dir, pool_size=0, extra_args=("--set", f"gvisor_sleep_after_seconds={sleep_after}"))
    server.start()
    load = HostLoad()
    try:
        with server.client(timeout=900) as c:
            available_before = mem_available()
            sids = []
            for _ in range(count):
                sid = create(c, isolation="gvisor", memory_mb=max(1024, mb * 3))["id"]
                execute(c, sid, f"import os; blob = bytearray(os.urandom({mb} << 20))")
                sids.append(sid)
            live = [c.get(f"/v1/sandboxes/{sid}").json() for sid in sids]
            live_cgroup = sum(v.get("memory_bytes") or 0 for v in live)
            available_live = mem_available()
            slept_in = wait_all_asleep(c, sids, sleep_after + 120.0 * count)
            time.sleep(2.0)
            available_asleep = mem_available()
            asleep = [c.get(f"/v1/sandboxes/{sid}").json() for sid in sids]
            checkpoint_bytes = sum((v.get("checkpoint") or {}).get("size_bytes") or 0 for v in asleep)
            checkpoint_disk = sum(allocated(server.sandbox_dir(sid) / "checkpoint") for sid in sids)
            st = os.statvfs(server.state_dir)
            free_disk = st.f_bavail * st.f_frsize
            wakes = []
            for sid in sids:
                t0 = time.perf_counter()
                events = execute(c, sid, "len(blob)")
                took = time.perf_counter() - t0
                note = "".join(e["text"] for e in events if e.get("type") == "stream" and e.get("name") == "stderr")
                intact = any(e.get("type") == "execute_result" and e["data"]["text/plain"] == str(mb << 20)
                             for e in events)
                wakes.append({"seconds": round(took, 2), "intact": intact, "note": note.strip()})
            for sid in sids:
                delete(c, sid)
    finally:
        server.stop()
    per_live = live_cgroup / count
    per_asleep = checkpoint_disk / count
    return {
        "count": count, "state_mb": mb, "sleep_after_s": sleep_after, "asleep_within_s": round(slept_in, 1),
        "live_cgroup_mb": round(live_cgroup / MB, 1), "live_per_sandbox_mb": round(per_live / MB, 1),
        "mem_available_before_mb": round(available_before / MB), "mem_available_live_mb": round(available_live / MB),
        "mem_available_asleep_mb": round(available_asleep / MB),
        "memory_freed_by_sleep_mb": round((available_asleep - available_live) / MB, 1),
        "checkpoint_size_mb": round(checkpoint_bytes / MB, 1), "checkpoint_disk_mb": round(checkpoint_disk / MB, 1),
        "asleep_disk_per_sandbox_mb": round(per_asleep / MB, 1), "free_disk_state_dir_mb": round(free_disk / MB),
        "host_holds_live": int(available_before // per_live) if per_live else None,
        "host_holds_asleep": int(free_disk // per_asleep) if per_asleep else None,
        "wakes": wakes, "host_load": load.finish(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sleep_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--sleep-after", type=int, default=5)
    args = parser.parse_args()
    result = run(args.state_dir, args.count, args.mb, args.sleep_after)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sleep.json").write_text(json.dumps(result, indent=1))
    keys = [k for k in result if k not in ("wakes", "host_load")]
    print(markdown_table(["", "value"], [[k, str(result[k])] for k in keys]))
    print(markdown_table(["wake", "s", "intact", "note"],
                         [[i, w["seconds"], w["intact"], w["note"]] for i, w in enumerate(result["wakes"])]))
    print("\nhost load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
