"""The warm pool: which pooled sandbox a create may claim, its targets, and its count of the
ready ones (only those still live)."""

from __future__ import annotations

import asyncio

from sandbox.runtime import vocabulary as V
from sandbox.core.warm_pool import compatible

from sandbox_dirs import handle_of, new_manager, sleeper

LIMITS = {"memory_mb": 256, "pids": 64, "cpus": 1.0, "disk_mb": 100, "open_files": 256, "tmp_mb": 64,
          "shm_mb": 64, "file_mb": 100, "output_bytes": 1 << 20, "timeout_seconds": 0}


def test_a_fixed_limit_must_match_and_a_cgroup_one_may_differ():
    by_rlimit = {"limits": LIMITS, "isolation": {"memory": "rlimit", "pids": "rlimit", "cpu": "none"}}
    by_cgroup = {"limits": LIMITS, "isolation": {"memory": "cgroup v2", "pids": "cgroup v2", "cpu": "cgroup v2"}}
    assert compatible(dict(LIMITS), by_rlimit)
    assert not compatible(LIMITS | {"disk_mb": 200}, by_cgroup), "the disk is fixed at launch"
    assert not compatible(LIMITS | {"memory_mb": 512}, by_rlimit)
    assert compatible(LIMITS | {"memory_mb": 512, "pids": 10, "cpus": 0.5}, by_cgroup)


def test_targets_come_from_the_config(tmp_path):
    pool = new_manager(tmp_path, pool_size=3, pool_sizes={"science": 1}).pool
    assert pool.target("default") == 3 and pool.target("science") == 1 and pool.target("other") == 0


def test_a_claim_skips_ended_sandboxes_and_stops_at_an_incompatible_one(tmp_path):
    manager = new_manager(tmp_path)
    pool = manager.pool
    process = sleeper()
    try:
        handle_of(manager, "sbx-big", V.POOLED, process=process, limits=LIMITS | {"disk_mb": 999})
        pool.add("default", "sbx-gone")  # ended meanwhile: not in the registry
        pool.add("default", "sbx-big")
        assert pool.status()["default"]["ready"] == 1
        claimed = asyncio.run(pool.claim("default", LIMITS, {"op": "claim"}))
        assert claimed is None
        assert list(pool.queues["default"]) == ["sbx-big"], "the incompatible one left the queue"
        assert pool.take_image("default") == ["sbx-big"] and "default" not in pool.queues
    finally:
        process.kill()
        process.wait()
