"""The gate refuses new sandboxes while the server stops or drains; the ledger counts what
claimed sandboxes and the creates under way hold (a paused one: only its disk)."""

from __future__ import annotations

import pytest

from sandbox.core.admission import held
from sandbox.common.errors import ApiError
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager, sleeper


def test_the_gate_refuses_while_draining_and_while_stopping(tmp_path):
    gate = new_manager(tmp_path, node_id="n1").gate
    gate.check()
    assert gate.may_fill_pool()
    gate.draining = True
    with pytest.raises(ApiError) as refused:
        gate.check()
    assert refused.value.status == 503 and refused.value.extra == {"reason": V.NODE_DRAINING}
    assert "n1 is draining" in refused.value.message and not gate.may_fill_pool()
    gate.draining = False
    gate.shutting_down.set()
    with pytest.raises(ApiError, match="shutting down"):
        gate.check()
    assert not gate.may_fill_pool()


def test_a_paused_sandbox_holds_only_its_disk():
    limits = {"memory_mb": 512, "cpus": 1.0, "disk_mb": 100}
    assert held({"state": V.RUNNING, "limits": limits}) == limits
    assert held({"state": V.PAUSED, "limits": limits}) == {"disk_mb": 100}


def test_usage_counts_claimed_sandboxes_and_reservations_not_the_pool(tmp_path):
    manager = new_manager(tmp_path, memory_request_mb=0)  # each reserves its whole limit
    ledger = manager.ledger
    process = sleeper()
    try:
        handle_of(manager, "sbx-run", V.RUNNING, process=process, limits={"memory_mb": 300, "disk_mb": 10})
        handle_of(manager, "sbx-pool", V.POOLED, process=process, limits={"memory_mb": 5000, "disk_mb": 10})
        handle_of(manager, "sbx-rest", V.PAUSED, limits={"memory_mb": 7000, "disk_mb": 20})
        before = ledger.usage()
        assert before["memory_mb"] == 300 and before["disk_mb"] == 30
        with pytest.raises(RuntimeError):
            with ledger.reserving({"memory_mb": 200, "disk_mb": 5}):
                assert ledger.usage()["memory_mb"] == 500
                raise RuntimeError("the create failed")
        assert ledger.usage() == before, "a failed create kept its reservation"
    finally:
        process.kill()
        process.wait()


def test_a_requests_limits_override_the_defaults(tmp_path):
    manager = new_manager(tmp_path)
    limits = manager.ledger.limits_for({"memory_mb": 321, "cpus": None, "disk_mb": 4096})
    defaults = manager.config.default_limits()
    assert limits["memory_mb"] == 321 and limits["cpus"] == defaults["cpus"]
    assert limits["file_mb"] == 4096, "a file may be as large as the disk"


def test_a_sandbox_reserves_its_memory_request_not_its_limit(tmp_path):
    """Like a Kubernetes request: what is counted against the total is memory_request_mb
    (or the limit, when that is smaller); the limit itself is unchanged."""
    manager = new_manager(tmp_path, memory_request_mb=256)
    process = sleeper()
    try:
        handle_of(manager, "sbx-big", V.RUNNING, process=process, limits={"memory_mb": 4096, "disk_mb": 10})
        handle_of(manager, "sbx-small", V.RUNNING, process=process, limits={"memory_mb": 100, "disk_mb": 10})
        assert manager.ledger.usage()["memory_mb"] == 256 + 100
        with manager.ledger.reserving({"memory_mb": 1024, "disk_mb": 5}):
            assert manager.ledger.usage()["memory_mb"] == 256 + 100 + 256
        assert manager.live["sbx-big"].record["limits"]["memory_mb"] == 4096
        manager.config.memory_request_mb = 0  # the control: whole limits
        assert manager.ledger.usage()["memory_mb"] == 4096 + 100
    finally:
        process.kill()
        process.wait()
