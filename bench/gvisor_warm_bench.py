"""The gVisor tier's warm pool: a gVisor kernel's cold start beside a bwrap kernel's.

`python -m bench.gvisor_warm_bench [--state-dir DIR] [--reps N]`

One server of its own with a warm pool for each tier (``--pool-size 1`` and
``gvisor_pool_size=1``, the image's preload on). Three kernels, started by `KernelManager`
as a notebook server starts them, each sample from `start_kernel` until the first cell
(`1 + 1`) has its reply and idle, in rotating order:

- ``sandbox`` (bwrap), which claims a pooled bwrap sandbox;
- ``sandbox-gvisor``, which claims a pooled gVisor sandbox;
- ``sandbox-gvisor`` with ``SANDBOX_KERNEL_DISK_MB=1023``, which no pooled sandbox (made with
  1024) can serve: a gVisor kernel as it started before the pool (its own boot).

Between samples both pools are let refill. Each sample records whether its sandbox came
from the pool. Then the pooled sandboxes' memory (their cgroups: Sentry, gofer and
runtime for gVisor), read from the state directory since pooled sandboxes are nobody's
and hidden from the API. Target: the pooled gVisor kernel's p50 at most 1.5x the bwrap
kernel's. Results in bench/results/gvisor_warm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

from kernel.drive import run_cell

from .harness import DEFAULT_STATE_DIR, BenchServer, HostLoad, markdown_table
from .kernel_bench import KernelSetup, stop

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ARMS = {"bwrap": ("sandbox", {}), "gvisor": ("sandbox-gvisor", {}),
        "gvisor_unpooled": ("sandbox-gvisor", {"SANDBOX_KERNEL_DISK_MB": "1023"})}


def pools_full(server: BenchServer, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = server.pool()
        tiers = [pool, pool.get("gvisor", {"ready": 0, "target": 1})]
        if all(t.get("ready", 0) >= t.get("target", 1) for t in tiers):
            time.sleep(0.3)
            return
        time.sleep(0.2)
    raise TimeoutError(f"the pools did not refill within {timeout} s: {server.pool()}")


def pooled_memory(server: BenchServer) -> dict[str, list[float]]:
    """MB in each pooled sandbox's memory cgroup, per tier."""
    out: dict[str, list[float]] = {}
    for d in (server.state_dir / "sandboxes").iterdir():
        try:
            record = json.loads((d / "state.json").read_text())
            spec = json.loads((d / "spec.json").read_text())
        except (OSError, ValueError):
            continue
        if record.get("state") != "pooled":
            continue
        for group in record.get("cgroup_dirs") or []:
            usage = pathlib.Path(group, "memory.usage_in_bytes")
            usage = usage if usage.exists() else pathlib.Path(group, "memory.current")
            if usage.exists():
                out.setdefault(spec.get("isolation_backend", "bwrap"), []).append(int(usage.read_text()) / 1e6)
    return out


def one(server: BenchServer, setup: KernelSetup, arm: str) -> tuple[float, bool | None]:
    name, extra = ARMS[arm]
    base = setup.env
    setup.env = {**base, **extra}
    try:
        t0 = time.perf_counter()
        km, kc = setup.start(name, timeout=300)
        try:
            reply, _ = run_cell(kc, "1 + 1", timeout=300)
            seconds = time.perf_counter() - t0
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"{arm}: the first cell failed: {reply['content']}")
            with server.client() as c:
                mine = c.get("/v1/sandboxes").json()["sandboxes"]
            from_pool = mine[0].get("from_pool") if len(mine) == 1 else None
        finally:
            stop(km, kc)
    finally:
        setup.env = base
    return seconds, from_pool


def run(state_dir: str, reps: int) -> dict:
    server = BenchServer(state_dir, pool_size=1, extra_args=("--set", "gvisor_pool_size=1"))
    server.start()
    load = HostLoad()
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    pooled: dict[str, list] = {arm: [] for arm in ARMS}
    try:
        setup = KernelSetup(server)
        # the kernel refuses to start in a folder on its sys.path (the repo, on PYTHONPATH here)
        os.chdir(setup.prefix)
        if setup.error:
            raise RuntimeError(setup.error)
        arms = list(ARMS)
        for arm in arms:  # one unrecorded warm-up each: cold page cache
            pools_full(server)
            one(server, setup, arm)
        for i in range(reps):
            for arm in arms[i % 3:] + arms[:i % 3]:
                pools_full(server)
                seconds, from_pool = one(server, setup, arm)
                samples[arm].append(seconds)
                pooled[arm].append(from_pool)
        pools_full(server)
        memory = pooled_memory(server)
    finally:
        server.stop()
    p50 = {arm: statistics.median(v) for arm, v in samples.items()}
    return {"reps": reps, "first_cell_s": {arm: [round(s, 3) for s in v] for arm, v in samples.items()},
            "p50_s": {arm: round(v, 3) for arm, v in p50.items()}, "from_pool": pooled,
            "ratio_gvisor_to_bwrap": round(p50["gvisor"] / p50["bwrap"], 2),
            "ratio_unpooled_gvisor_to_bwrap": round(p50["gvisor_unpooled"] / p50["bwrap"], 2),
            "target": "pooled gVisor kernel p50 <= 1.5x bwrap kernel p50",
            "meets_target": p50["gvisor"] / p50["bwrap"] <= 1.5,
            "pooled_memory_mb": memory, "host_load": load.finish()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gvisor_warm_bench")
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", DEFAULT_STATE_DIR))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    result = run(args.state_dir, args.reps)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gvisor_warm.json").write_text(json.dumps(result, indent=1))
    bwrap = result["p50_s"]["bwrap"]
    print(markdown_table(["kernel start to first cell answered", "p50, s", "vs bwrap", "from the pool"], [
        [arm, f"{result['p50_s'][arm]:.2f}", f"{result['p50_s'][arm] / bwrap:.2f}x",
         f"{sum(1 for p in result['from_pool'][arm] if p)}/{len(result['from_pool'][arm])}"] for arm in ARMS]))
    print(f"\ntarget: {result['target']}: {'met' if result['meets_target'] else 'not met'}")
    print("pooled sandboxes' memory (cgroup, MB):", json.dumps(result["pooled_memory_mb"]))
    print("host load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
